#pragma once
// The subcommands of the fathom executable. Each returns the process exit code and throws
// fathom::Error for bad input (main prints it on one line and exits 1).
namespace fathom {

int run_generate(int argc, char** argv);  // fathom generate ...
int run_logits(int argc, char** argv);    // fathom logits ...
int run_chat(int argc, char** argv);      // fathom chat ... (interactive)
int run_serve(int argc, char** argv);     // fathom serve ... (HTTP + gRPC server until SIGTERM)

}  // namespace fathom
