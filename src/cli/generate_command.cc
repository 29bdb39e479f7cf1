#include "cli/commands.h"
namespace atelier::cli {
void add_generate_command(CLI::App& app, GenerateOptions& o) { app.add_subcommand("generate", "Generate images"); }
int run_generate(const GenerateOptions& o) { std::fprintf(stderr, "generate: pipeline not wired yet\n"); return 1; }
void add_info_command(CLI::App& app, InfoOptions& o) { app.add_subcommand("info", "Describe a model"); }
int run_info(const InfoOptions& o) { return 1; }
}  // namespace atelier::cli
