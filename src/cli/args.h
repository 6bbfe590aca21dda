// A small flag parser for the dsv4 CLI: `--name value`, `--name=value` and boolean `--name`.
// Unknown flags and missing values are errors that name the flag.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace dsv4::cli {

class Args {
 public:
  // `flags`: flags that take a value; `switches`: boolean flags.
  Args(int argc, char** argv, int first, const std::set<std::string>& flags, const std::set<std::string>& switches) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      const size_t eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (switches.count(name)) {
        values_[name] = "1";
      } else if (flags.count(name)) {
        if (!inline_value) {
          if (i + 1 >= argc) fail("flag --", name, " needs a value");
          value = argv[++i];
        }
        values_[name] = value;
      } else {
        fail("unknown flag --", name);
      }
    }
  }
  bool has(const std::string& n) const { return values_.count(n) != 0; }
  std::string get(const std::string& n, const std::string& dflt = "") const {
    auto it = values_.find(n);
    return it == values_.end() ? dflt : it->second;
  }
  long long get_int(const std::string& n, long long dflt) const {
    if (!has(n)) return dflt;
    try {
      size_t used = 0;
      long long v = std::stoll(get(n), &used);
      if (used != get(n).size()) throw std::invalid_argument("trailing");
      return v;
    } catch (const std::exception&) {
      fail("flag --", n, " needs an integer (got '", get(n), "')");
    }
  }
  double get_double(const std::string& n, double dflt) const {
    if (!has(n)) return dflt;
    try {
      size_t used = 0;
      double v = std::stod(get(n), &used);
      if (used != get(n).size()) throw std::invalid_argument("trailing");
      return v;
    } catch (const std::exception&) {
      fail("flag --", n, " needs a number (got '", get(n), "')");
    }
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace dsv4::cli
