#include "forms.hpp"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <stdexcept>

namespace hfdelta::cli {

namespace {

const CLI::App* g_app = nullptr;  // set_forms: for --completion
const Command* g_command = nullptr;

bool is_builtin(const CLI::Option* o) { return o->check_name("--help") || o->check_name("--version"); }

const CLI::Option* option_of(const CLI::App& app, const std::string& name) {
  const CLI::Option* o = app.get_option_no_throw(name);
  if (!o) throw std::logic_error(app.get_name() + ": the forms' table names " + name + ", which is no option");
  return o;
}

bool given(const CLI::App& app, const std::string& name) { return option_of(app, name)->count() > 0; }

// "--root ROOT", "--target N", "--init": an option as a usage line shows it.
std::string with_value(const CLI::App& app, const std::string& name) {
  const CLI::Option* o = option_of(app, name);
  // The type name without the validators' descriptions ("INT:INT in [1 - 19]").
  const std::string type = o->get_type_size() == 0 ? "" : o->get_type_name().substr(0, o->get_type_name().find(':'));
  return type.empty() ? name : name + " " + type;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Every option of `app` is in the table and every name of the table is an
// option of `app`: the table is the whole command line.
void check_table(const CLI::App& app, const Command& c) {
  std::vector<std::string> named = c.common;
  for (const Form& f : c.forms) {
    if (!f.selector.empty()) named.push_back(f.selector);
    named.insert(named.end(), f.options.begin(), f.options.end());
  }
  for (const Rule& r : c.rules) {
    named.push_back(r.option);
    named.insert(named.end(), r.needs.begin(), r.needs.end());
    named.insert(named.end(), r.excludes.begin(), r.excludes.end());
  }
  for (const std::string& n : named) option_of(app, n);
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional() || is_builtin(o)) continue;
    const bool listed = std::any_of(named.begin(), named.end(), [&](const std::string& n) { return o->check_name(n); });
    if (!listed) throw std::logic_error(c.name + ": " + o->get_name() + " is in no form of the forms' table");
  }
}

// A usage line, wrapped at 100 columns with its continuations indented.
std::string usage_line(const CLI::App& app, const Command& c, const Form& f) {
  std::vector<std::string> words{c.name};
  if (!f.selector.empty()) words.push_back(with_value(app, f.selector));
  for (const std::string& o : f.options) words.push_back("[" + with_value(app, o) + "]");
  if (!c.common.empty()) words.emplace_back("[OPTIONS]");
  words.insert(words.end(), f.paths.begin(), f.paths.end());
  std::string out = "  ", line;
  for (const std::string& w : words) {
    if (!line.empty() && line.size() + 1 + w.size() > 98) out += line + "\n      ", line.clear();
    line += (line.empty() ? "" : " ") + w;
  }
  return out + line + "\n      " + f.help + "\n";
}

class TableFormatter : public CLI::Formatter {
 public:
  TableFormatter(const CLI::App& app, const Command& c) : app_(app), c_(c) {}
  std::string make_usage(const CLI::App*, std::string) const override {
    std::string out = "Usage:\n";
    for (const Form& f : c_.forms) out += usage_line(app_, c_, f);
    out += "  " + c_.name + " --version\n";
    if (!c_.common.empty()) out += "[OPTIONS], which every form takes: " + join(c_.common, " ") + "\n";
    return out;
  }

 private:
  const CLI::App& app_;
  const Command& c_;
};

// A bash word list: every name of each option (`-q --quiet`).
std::string names(const CLI::App& app, const std::vector<std::string>& options) {
  std::vector<std::string> out;
  for (const std::string& n : options) {
    const CLI::Option* o = option_of(app, n);
    for (const std::string& s : o->get_snames()) out.push_back("-" + s);
    for (const std::string& l : o->get_lnames()) out.push_back("--" + l);
  }
  return join(out, " ");
}

}  // namespace

void set_forms(CLI::App& app, const Command& c) {
  check_table(app, c);
  g_app = &app, g_command = &c;
  app.formatter(std::make_shared<TableFormatter>(app, c));
}

std::string form_signature(const CLI::App& app, const Command& c, const Form& f) {
  std::vector<std::string> words{c.name};
  if (!f.selector.empty()) words.push_back(with_value(app, f.selector));
  words.insert(words.end(), f.paths.begin(), f.paths.end());
  return join(words, " ");
}

const Form& select_form(const CLI::App& app, const Command& c) {
  const Form* form = nullptr;
  for (const Form& f : c.forms) {
    if (f.selector.empty() || !given(app, f.selector)) continue;
    if (form) throw CLI::ValidationError(form->selector + " cannot be combined with " + f.selector);
    form = &f;
  }
  for (const Form& f : c.forms)
    if (!form && f.selector.empty()) form = &f;
  if (!form) throw std::logic_error(c.name + ": no form is chosen without an option");
  return *form;
}

namespace {

// Every option given is common, `f`'s selector or one of `f`'s options.
void check_options(const CLI::App& app, const Command& c, const Form& f) {
  for (const CLI::Option* o : app.get_options()) {
    if (!o->nonpositional() || is_builtin(o) || o->count() == 0) continue;
    const auto named = [&](const std::string& n) { return o->check_name(n); };
    if (std::any_of(c.common.begin(), c.common.end(), named) ||
        std::any_of(f.options.begin(), f.options.end(), named) || (!f.selector.empty() && named(f.selector)))
      continue;
    std::vector<std::string> taking;
    for (const Form& other : c.forms)
      if (std::any_of(other.options.begin(), other.options.end(), named))
        taking.push_back(form_signature(app, c, other));
    throw CLI::ValidationError(o->get_name(),
                               "only " + join(taking, " or ") + " takes it, not " + form_signature(app, c, f));
  }
}

void check_rules(const CLI::App& app, const Command& c) {
  for (const Rule& r : c.rules) {
    if (!given(app, r.option)) continue;
    for (const std::string& n : r.needs)
      if (!given(app, n)) throw CLI::ValidationError(r.option + " requires " + n);
    for (const std::string& x : r.excludes)
      if (given(app, x)) throw CLI::ValidationError(r.option + " excludes " + x);
  }
}

void check_paths(const CLI::App& app, const Command& c, const Form& f, const std::vector<std::string>& paths) {
  const std::size_t most = f.paths.size();
  const std::size_t least =
      std::count_if(f.paths.begin(), f.paths.end(), [](const std::string& p) { return p.front() != '['; });
  if (paths.size() >= least && paths.size() <= most) return;
  const std::string want = least == most ? std::to_string(most) : std::to_string(least) + " or " + std::to_string(most);
  throw CLI::ValidationError(form_signature(app, c, f) + " takes " + want + " path" + (most == 1 ? "" : "s") +
                             ", not " + std::to_string(paths.size()) +
                             (paths.size() > most ? ": unexpected argument \"" + paths[most] + "\"" : ""));
}

}  // namespace

void check_form(const CLI::App& app, const Command& c, const Form& f, const std::vector<std::string>& paths) {
  check_options(app, c, f);
  check_rules(app, c);
  check_paths(app, c, f, paths);
}

std::string bash_completion(const CLI::App& app, const Command& c) {
  std::string fn = "_hfdelta_" + c.name;
  std::replace(fn.begin(), fn.end(), '-', '_');
  std::string choose, lists, any;
  std::vector<std::string> selectors;
  for (std::size_t i = 0; i < c.forms.size(); ++i) {
    const Form& f = c.forms[i];
    std::vector<std::string> opts = f.options;
    opts.insert(opts.end(), c.common.begin(), c.common.end());
    opts.emplace_back("--help");
    if (f.selector.empty()) {
      any = names(app, opts);
      continue;
    }
    selectors.push_back(f.selector);
    choose += "      " + names(app, {f.selector}) + ") form=" + std::to_string(i) + " ;;\n";
    lists += "    " + std::to_string(i) + ") opts='" + names(app, opts) + "' ;;\n";
  }
  if (any.empty()) any = names(app, c.common) + " --help";
  any += (selectors.empty() ? "" : " " + names(app, selectors)) + " --version";
  return "# bash completion for " + c.name + ", generated from its forms (" + c.name + " --completion bash).\n" + fn +
         "() {\n"
         "  local cur=${COMP_WORDS[COMP_CWORD]} form= i opts\n"
         "  for ((i = 1; i < COMP_CWORD; i++)); do\n" +
         (choose.empty() ? "    :\n" : "    case ${COMP_WORDS[i]} in\n" + choose + "    esac\n") +
         "  done\n"
         "  [[ $cur == -* ]] || return 0  # a path or a value: bash's file names (-o default)\n"
         "  case $form in\n" +
         lists + "    *) opts='" + any +
         "' ;;\n"
         "  esac\n"
         "  COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n"
         "}\n"
         "complete -o default -F " +
         fn + " " + c.name + "\n";
}

std::string zsh_completion(const CLI::App& app, const Command& c) {
  return "# zsh completion for " + c.name + " (" + c.name +
         " --completion zsh; source it from .zshrc after compinit): its bash\n"
         "# completion, run by zsh's bash emulation.\n"
         "autoload -U +X bashcompinit && bashcompinit\n" +
         bash_completion(app, c);
}

const std::vector<Moved>& moved_options() {
  static const std::vector<Moved> none;
  return g_command ? g_command->moved : none;
}

int completion_flag(int argc, char** argv, bool& handled) {
  handled = argc == 3 && std::strcmp(argv[1], "--completion") == 0 && g_command;
  if (!handled) return 0;
  const bool zsh = std::strcmp(argv[2], "zsh") == 0;
  if (!zsh && std::strcmp(argv[2], "bash") != 0) {
    std::cerr << g_command->name << ": error: --completion: bash or zsh, not " << argv[2] << "\n";
    return 2;
  }
  std::cout << (zsh ? zsh_completion(*g_app, *g_command) : bash_completion(*g_app, *g_command)) << std::flush;
  return std::cout ? 0 : 1;
}

}  // namespace hfdelta::cli
