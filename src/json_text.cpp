#include "json_text.hpp"

#include <set>
#include <vector>

#include "hfdelta/error.hpp"

namespace hfdelta {

using nlohmann::json;

json parse_json_text(std::string_view text, const std::string& what, const std::string& subject) {
  std::vector<std::set<std::string>> seen;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > kMaxJsonDepth)
      fail(Exit::bad_input, what + ": " + subject + " is nested too deeply (more than " + std::to_string(kMaxJsonDepth) + " levels)");
    switch (ev) {
      case json::parse_event_t::object_start: seen.emplace_back(); break;
      case json::parse_event_t::object_end: seen.pop_back(); break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!seen.back().insert(k).second) fail(Exit::bad_input, what + ": " + subject + " has duplicate key \"" + k + "\"");
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail(Exit::bad_input, what + ": " + subject + " is not valid UTF-8 JSON: " + e.what());
  }
}

}  // namespace hfdelta
