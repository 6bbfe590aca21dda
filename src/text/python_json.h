// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it
// (", " and ": " separators, keys in insertion order, floats as Python's repr),
// which the V4 chat encoding uses for tool schemas and arguments.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dsv4::text {

std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace dsv4::text
