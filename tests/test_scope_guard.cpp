// OnFailure (util/scope_guard.hpp): the cleanup of a scope left by an exception.
#include <stdexcept>
#include <string>

#include <doctest/doctest.h>

#include "util/scope_guard.hpp"

using hfdelta::OnFailure;

TEST_CASE("OnFailure: runs when its scope is left by an exception, not otherwise") {
  int undone = 0;
  {
    const OnFailure undo([&] { ++undone; });
  }
  CHECK(undone == 0);
  CHECK_THROWS_AS(([&] {
                    const OnFailure undo([&] { ++undone; });
                    throw std::runtime_error("boom");
                  }()),
                  std::runtime_error);
  CHECK(undone == 1);
}

TEST_CASE("OnFailure: an exception caught inside its scope is no failure of the scope") {
  int undone = 0;
  {
    const OnFailure undo([&] { ++undone; });
    try {
      throw std::runtime_error("handled");
    } catch (const std::runtime_error&) {}
  }
  CHECK(undone == 0);
}

TEST_CASE("OnFailure: made while another exception unwinds, it runs only for a failure of its own scope") {
  int undone = 0;
  struct Cleanup {
    int& undone;
    ~Cleanup() {
      const OnFailure undo([&] { ++undone; });  // this scope ends normally
    }
  };
  CHECK_THROWS_AS(([&] {
                    const Cleanup c{undone};
                    throw std::runtime_error("boom");
                  }()),
                  std::runtime_error);
  CHECK(undone == 0);
}

TEST_CASE("OnFailure: what the cleanup throws is swallowed; the first exception goes on") {
  bool ran = false;
  try {
    const OnFailure undo([&] {
      ran = true;
      throw std::logic_error("cleanup failed");
    });
    throw std::runtime_error("the failure");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "the failure");
  }
  CHECK(ran);
}
