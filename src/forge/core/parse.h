// Parsing key=value settings (command-line overrides and config files) with one-line errors
// that name the setting: "override n_layer=two: expected an integer".
#pragma once

#include <string>

namespace forge {

int parse_setting_int(const std::string& key, const std::string& value);
double parse_setting_double(const std::string& key, const std::string& value);
// true/false/1/0.
bool parse_setting_bool(const std::string& key, const std::string& value);

}  // namespace forge
