// Each `dsv4` subcommand registers itself on the root CLI11 app. A command's callback
// throws dsv4::Error for bad input; main() prints it and exits non-zero.
#pragma once

#include <CLI/CLI.hpp>

namespace dsv4::cli {

void add_make_model_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);

}  // namespace dsv4::cli
