// The --json objects of delta-diff and delta-apply (man delta-diff, man
// delta-apply: JSON OUTPUT), built in one place for the commands and the
// Python package alike. inspection_json (inspect.hpp) and prune_json
// (prune.hpp) are the other two.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publication.hpp"
#include "hfdelta/squash.hpp"
#include "hfdelta/verify.hpp"

namespace hfdelta {

// The version of the objects' layout (the "schema" field of each): raised
// when a field changes meaning or goes away, not when one is added.
inline constexpr int kJsonSchema = 1;

// `j` as reported: "schema" added, and "ok" (true unless `j` says otherwise).
nlohmann::json json_report(nlohmann::json j);

// The error object of a failed command: {"ok": false, "exit_code", "error":
// {"kind", "message", "path"}} (path null when the error is about no file).
nlohmann::json error_json(int code, const std::string& message, const std::string& path = {});

// delta-diff BASE NEW OUT: `out` the version directory written, `encoding`
// as asked ("sparse", "xor", "overwrite" or "auto").
nlohmann::json diff_json(const std::string& out, const std::string& encoding, const DiffSummary& s);

// delta-diff --squash FIRST LAST OUT.
nlohmann::json squash_json(const std::string& out, const SquashSummary& s);

// delta-diff --full [BASE] NEW OUT: `sidecar` and `sidecar_out`, the delta
// published beside the full version (none without BASE).
nlohmann::json full_json(const std::string& out, const FullSummary& f, const DiffSummary* sidecar,
                         const std::string& sidecar_out);

// The "phases" object of change_json: the totals (lock, read, patch, sync,
// then: null when no hook ran; before_then, their sum before the hook) and
// "versions", each version's share.
nlohmann::json phases_json(const ApplyResult& r);

// A pull's "behind_complete": how many versions the newest complete
// version is above the one LOCAL holds after it (0: none newer).
std::uint64_t behind_complete(const ApplyResult& r);

// delta-apply DELTA LOCAL, --init, --root and --recover: what changed. A
// failed `then` hook makes it the error object of exit 9 too (ok false,
// exit_code, error), with the result of the operation it followed.
nlohmann::json change_json(const std::string& local, const ApplyResult& r);

// delta-apply --status: LOCAL's state and the exit code it maps to (0 clean,
// 10 interrupted, 11 uninitialised; ok only when clean).
const char* status_state_name(const LocalStatus& s);  // clean, interrupted or uninitialised
Exit status_exit(const LocalStatus& s);
nlohmann::json status_json(const std::string& local, const LocalStatus& s);

// delta-apply --verify: 0 clean, 10 interrupted, 11 uninitialised, 12 corrupt.
const char* verify_state_name(VerifyReport::State s);
Exit verify_exit(const VerifyReport& v);
nlohmann::json verify_json(const std::string& local, const VerifyReport& v);

}  // namespace hfdelta
