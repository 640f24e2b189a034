#include "util/json_text.hpp"

#include <unordered_set>
#include <vector>

#include <xxhash.h>

#include "hfdelta/error.hpp"

namespace hfdelta {

using nlohmann::json;

namespace {

// The first pass: counts and checks, keeping only a hash per key of each
// open object (a collision of 64-bit hashes among one object's keys would
// take far more keys than the limits allow to be likely).
class Checker : public nlohmann::json_sax<json> {
 public:
  Checker(const std::string& what, const std::string& subject, const JsonLimits& limits)
      : what_(what), subject_(subject), limits_(limits) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    value();
    open(true);
    return true;
  }
  bool key(string_t& k) override {
    value();
    if (!objects_.back().insert(XXH3_64bits(k.data(), k.size())).second)
      fail(Exit::bad_input, what_, subject_ + " has duplicate key \"" + k + "\"");
    return true;
  }
  bool end_object() override {
    objects_.pop_back();
    close();
    return true;
  }
  bool start_array(std::size_t) override {
    value();
    open(false);
    return true;
  }
  bool end_array() override {
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(Exit::bad_input, what_, subject_ + " is not valid UTF-8 JSON: " + e.what());
  }

 private:
  bool value() {
    if (++values_ > limits_.values)
      fail(Exit::bad_input, what_,
           subject_ + " has more than " + std::to_string(limits_.values) +
               " values and keys, more than any real one has");
    return true;
  }
  void open(bool object) {
    if (++depth_ > limits_.depth)
      fail(Exit::bad_input, what_,
           subject_ + " is nested too deeply (more than " + std::to_string(limits_.depth) + " levels)");
    if (object) objects_.emplace_back();
  }
  void close() { --depth_; }

  const std::string& what_;
  const std::string& subject_;
  const JsonLimits& limits_;
  std::uint64_t values_ = 0;
  int depth_ = 0;
  std::vector<std::unordered_set<std::uint64_t>> objects_;
};

// Serialiser output that feeds a hash instead of a string.
class HashOutput : public nlohmann::detail::output_adapter_protocol<char> {
 public:
  explicit HashOutput(Hasher& h) : h_(h) {}
  void write_character(char c) override { h_.update({reinterpret_cast<const std::uint8_t*>(&c), 1}); }
  void write_characters(const char* s, std::size_t n) override {
    h_.update({reinterpret_cast<const std::uint8_t*>(s), n});
  }

 private:
  Hasher& h_;
};

}  // namespace

Hash128 xxh3_128_of_dump(const json& j) {
  Hasher h;
  nlohmann::detail::serializer<json> s(std::make_shared<HashOutput>(h), ' ', json::error_handler_t::strict);
  s.dump(j, false, false, 0);
  return h.digest();
}

json parse_json_text(std::string_view text, const std::string& what, const std::string& subject,
                     const JsonLimits& limits) {
  if (text.size() > limits.bytes)
    fail(Exit::bad_input, what,
         subject + " is " + std::to_string(text.size()) + " bytes, more than the " + std::to_string(limits.bytes) +
             " it may have");
  Checker checker(what, subject, limits);
  try {
    json::sax_parse(text.begin(), text.end(), &checker);
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail(Exit::bad_input, what, subject + " is not valid UTF-8 JSON: " + e.what());
  }
}

}  // namespace hfdelta
