// kpack-llama: see llama/cli.h.
#include <iostream>

#include "cli.h"

int main(int argc, char** argv) {
  return kpack::llama::KpackLlamaMain(argc, argv, std::cout, std::cerr);
}
