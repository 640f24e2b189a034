// A command's forms as one table: which option chooses each form, its path
// arguments, and the options it takes. The table is the one place that says
// which option goes with which form: the parsing checks a command line
// against it (check_form), --help prints its usage lines from it
// (set_forms), and the shell completion offers its options
// (bash_completion, printed by the hidden `--completion bash`).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace hfdelta::cli {

struct Form {
  // The option that chooses it ("--root"); "" for the one form chosen when
  // no form's option is given.
  std::string selector;
  // Its path arguments, as --help names them ("LOCAL"); "[BASE]" may be left out.
  std::vector<std::string> paths;
  // The options it takes besides the command's common ones.
  std::vector<std::string> options;
  // What it does: --help's line under its usage.
  std::string help;
};

// Within a form: an option that needs others or excludes them.
struct Rule {
  std::string option;
  std::vector<std::string> needs, excludes;
};

// An option of an earlier release that is now another name or command:
// refused (exit 2) with `now`, what to write instead, so that a script still
// giving it is told rather than running something else.
struct Moved {
  std::string old_name;  // "--fleet"
  std::string now;       // "the fleet view is delta-fleet ROOT"
};

struct Command {
  std::string name;                 // "delta-apply"
  std::string about;                // the first line of --help
  std::vector<Form> forms;          // in --help's order
  std::vector<std::string> common;  // the options every form takes
  std::vector<Rule> rules;
  std::vector<Moved> moved{};  // refused with where they went
};

// Makes `c` the command `app` parses (its --help usage lines, --completion;
// `app` must outlive the run). Every option the table names must be one of
// `app`'s, and every option of `app` one the table names (a mismatch throws
// std::logic_error: a programming error, caught by every test).
void set_forms(CLI::App& app, const Command& c);

// The form the parsed command line chose: the one whose option it gives,
// else the one chosen without any; CLI::ValidationError (exit 2) for two
// forms' options.
const Form& select_form(const CLI::App& app, const Command& c);

// Checks the parsed command line against form `f`: every option given is
// the form's or a common one, the rules hold, and the number of path
// arguments (`paths`) fits; CLI::ValidationError (exit 2) saying what does
// not fit otherwise.
void check_form(const CLI::App& app, const Command& c, const Form& f, const std::vector<std::string>& paths);

// "delta-apply --root ROOT LOCAL": the form as messages name it.
std::string form_signature(const CLI::App& app, const Command& c, const Form& f);

// A bash completion script for `c`: after a form's option, that form's
// options and the common ones; before any, every form's option too; paths
// and values complete as file names.
std::string bash_completion(const CLI::App& app, const Command& c);
// The same for zsh: the bash completion under zsh's bashcompinit.
std::string zsh_completion(const CLI::App& app, const Command& c);

// The moved options of the command set_forms registered (none before).
const std::vector<Moved>& moved_options();

// `--completion bash` (or zsh), alone on the command line: prints the completion of
// the command set_forms registered, and says so (`handled`). Not in --help:
// it is for packaging (meson installs its output), not for a terminal.
int completion_flag(int argc, char** argv, bool& handled);

}  // namespace hfdelta::cli
