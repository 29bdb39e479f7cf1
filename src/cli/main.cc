// atelier: the command-line entry point. Thin: parses flags into requests and calls the library.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Atelier: text-to-image engine (Stable Diffusion 1.x/2.x; CPU, CUDA)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("atelier ") + ATELIER_VERSION);
  atelier::cli::GenerateOptions gen;
  atelier::cli::add_generate_command(app, gen);
  atelier::cli::InfoOptions info;
  atelier::cli::add_info_command(app, info);
  atelier::cli::BenchCliOptions bench;
  atelier::cli::add_bench_command(app, bench);
  atelier::serve::ServeOptions serve;
  atelier::cli::add_serve_command(app, serve);
  atelier::serve::redis::RedisWorkerOptions worker;
  atelier::cli::add_worker_command(app, worker);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (app.got_subcommand("generate")) return atelier::cli::run_generate(gen);
  if (app.got_subcommand("info")) return atelier::cli::run_info(info);
  if (app.got_subcommand("bench")) return atelier::cli::run_bench(bench);
  if (app.got_subcommand("serve")) return atelier::cli::run_serve(serve);
  if (app.got_subcommand("worker")) return atelier::cli::run_worker(worker);
  return 2;
}
