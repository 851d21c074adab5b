// The `dsv4` command: dispatches to one subcommand per file (cmd_*.cc).
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv4: an inference engine for DeepSeek-V4 models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Print help for every subcommand");
  dsv4::cli::add_make_model_command(app);
  dsv4::cli::add_inspect_command(app);
  dsv4::cli::add_plan_command(app);
  dsv4::cli::add_logits_command(app);
  dsv4::cli::add_generate_command(app);
  dsv4::cli::add_serve_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dsv4::Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
