// Sub-commands of the `atelier` binary. Each returns the process exit code (0 ok, 1 failure, 2 bad usage).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "pipeline/request.h"
#include "serve/server.h"

namespace atelier::cli {

struct GenerateOptions {
  std::string model;
  std::string tokenizer;
  std::string output = "atelier.png";
  GenerateRequest request;
};
void add_generate_command(CLI::App& app, GenerateOptions& o);
int run_generate(const GenerateOptions& o);

struct InfoOptions {
  std::string model;
  std::string tokenizer;
  bool json = false;
};
void add_info_command(CLI::App& app, InfoOptions& o);
int run_info(const InfoOptions& o);

void add_serve_command(CLI::App& app, serve::ServeOptions& o);
int run_serve(const serve::ServeOptions& o);

}  // namespace atelier::cli
