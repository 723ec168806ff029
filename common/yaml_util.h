// Small helpers for decoding YAML (yaml-cpp) into typed values with messages people can act
// on. They are shared by the job spec decoder and anything else that reads YAML config.
//
// Decode* functions return InvalidArgument whose message is only the problem ("expected an
// integer, got 'abc'"); the caller knows the field path and line and adds them. They are
// stricter than yaml-cpp's as<T>(): "1.5" is not an int, "12abc" is not a number, and
// non-finite doubles are rejected. All functions are thread-compatible (no shared state).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace drover::yaml_util {

// Parses `text` into `*out`. A syntax error becomes InvalidArgument "invalid YAML at line L,
// column C: <parser message>" (1-based), never an exception. An empty document is a Null node.
// Also InvalidArgument: a second document (after '---'), and any tag CheckTags refuses.
Status Parse(const std::string& text, YAML::Node* out);

// InvalidArgument naming the tag and its line when a node of `root` carries a tag other
// than the standard !!str, !!int, !!float, !!bool, !!null, !!seq and !!map: a reader that
// ignores "!!python/object" or "!secret" would take the value for something it is not.
Status CheckTags(const YAML::Node& root);

// 1-based line of `node` in the text it was parsed from; 0 when the node was built in code.
int LineOf(const YAML::Node& node);

// "'abc'" for a scalar, "a list", "a mapping" or "nothing" (null): for "got ..." messages.
std::string Describe(const YAML::Node& node);

Status DecodeScalar(const YAML::Node& node, int* out);
Status DecodeScalar(const YAML::Node& node, int64_t* out);
Status DecodeScalar(const YAML::Node& node, uint64_t* out);
Status DecodeScalar(const YAML::Node& node, double* out);
Status DecodeScalar(const YAML::Node& node, bool* out);  // true/false, yes/no, on/off
// Any scalar's text; null (an empty value) decodes to "".
Status DecodeScalar(const YAML::Node& node, std::string* out);

// Strict text-to-number conversions used by DecodeScalar (whole string, decimal).
bool ParseInt64(std::string_view text, int64_t* out);
bool ParseDouble(std::string_view text, double* out);  // finite values only

// Shortest text that reads back as the same double, always with a '.' or an exponent so
// that other YAML readers see a float ("1.0", "0.001", "1.0e-08").
std::string FormatDouble(double value);

// Levenshtein distance (insert, delete, substitute; each costs 1).
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `word` when it is close enough to be a likely typo, else "".
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace drover::yaml_util
