// Built (never run by ctest) when nvcc exists: links the CUDA forward backend into an executable
// so a missing symbol fails the build. `fathom_cuda_backend_check model.gguf` loads the model and
// builds the backend: without a GPU it prints the factory's one-line error and exits 0.
#include <cstdio>
#include <memory>

#include "base/error.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/model/model.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s model.gguf (link check only)\n", argv[0]);
    return 0;
  }
  try {
    std::unique_ptr<fathom::Model> model = fathom::Model::load(argv[1]);
    std::unique_ptr<fathom::Backend> backend = fathom::make_cuda_backend(*model, fathom::ModelOptions{});
    std::printf("backend %s ready\n", backend->name().c_str());
  } catch (const fathom::Error& e) {
    std::printf("%s\n", e.what());
  }
  return 0;
}
