// Incremental parser for one DSML tool-call block, as DeepSeek-V4 writes it:
//
//   <｜DSML｜tool_calls>\n
//   <｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="K" string="true|false">VALUE</｜DSML｜parameter>\n   (0 or more)
//   </｜DSML｜invoke>\n                                                          (1 or more invokes)
//   </｜DSML｜tool_calls>
//
// Text is appended as it streams in; the parser resumes from the last element
// it completed, so a long VALUE is scanned once. It says as early as possible
// when the text can no longer become a valid block.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4::text {

struct DsmlToolCall {
  std::string name;
  std::string arguments;  // JSON object text, built as encoding_dsv4.py does
};

class DsmlBlockParser {
 public:
  enum class Status { kNeedMore, kComplete, kInvalid };

  // Appends text (which must start with "<｜DSML｜" on the first call) and
  // parses as far as possible. With `final`, missing text makes it invalid.
  Status feed(std::string_view more, bool final);

  // All text given so far.
  const std::string& text() const { return text_; }
  // When complete: the block's length in text() (up to and including the end tag).
  std::size_t block_length() const { return pos_; }
  const std::vector<DsmlToolCall>& calls() const { return calls_; }
  // A string="false" value that was not valid JSON was passed as a JSON string.
  bool coerced() const { return coerced_; }

 private:
  enum class Step { kOk, kNeedMore, kInvalid };
  Step step();
  Step parse_param(std::size_t& p);

  enum class State { kHeader, kBetweenInvokes, kInInvoke, kDone };
  State state_ = State::kHeader;
  std::string text_;
  std::size_t pos_ = 0;           // end of the last completed element
  std::size_t value_scan_ = 0;    // where to resume looking for a parameter end tag
  std::string name_;              // current invoke
  std::vector<std::pair<std::string, std::string>> args_;  // key -> JSON value text
  std::vector<DsmlToolCall> calls_;
  bool coerced_ = false;
  bool blank_ok_ = false;         // just after an invoke header
  Status status_ = Status::kNeedMore;
};

}  // namespace dsv4::text
