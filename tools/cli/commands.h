// The `kpack` command line: one function per subcommand, each writing its report to
// `out` and problems to `err` and returning the process exit code. RunCli parses argv.
// Kept as a library so tests run the commands in-process against the fake driver.

#ifndef KPACK_TOOLS_CLI_COMMANDS_H_
#define KPACK_TOOLS_CLI_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace kpack::cli {

// Exit codes.
inline constexpr int kOk = 0;
inline constexpr int kFailed = 1;  // the check or the launch failed
inline constexpr int kUsage = 2;   // bad command line

int RunCli(int argc, char** argv, std::ostream& out, std::ostream& err);

struct InspectOptions {
  std::string pack;
  std::string kernel;  // empty: all
  bool json = false;
  // Inspecting needs no driver; one named here must load (as for every subcommand), and
  // the report says which it is.
  std::string driver;
};
int Inspect(const InspectOptions& o, std::ostream& out, std::ostream& err);

struct VerifyOptions {
  std::string pack;
  // The driver that loads every variant after the offline checks. Empty: the default
  // ($KPACK_CUDA_DRIVER, else libcuda.so.1), skipped when it does not load; a path given
  // here (or in $KPACK_CUDA_DRIVER) must load, or verify fails as doctor does.
  std::string driver;
  bool offline = false;  // the offline checks only; no driver is loaded
};
int Verify(const VerifyOptions& o, std::ostream& out, std::ostream& err);

struct RunOptions {
  std::string pack;
  std::string kernel;
  std::vector<std::string> args;     // name=VALUE
  std::vector<std::string> outputs;  // name=@file.npy
  std::string grid;                  // "X[,Y[,Z]]"; empty: the grid expressions
  std::string driver;
  int device = 0;
  // Skip the check that every pointer argument's buffer holds at least as many elements as
  // the smallest positive integer argument (for buffers small by design).
  bool size_check_off = false;
  // bench only
  int batch = 256;
  int repetitions = 20;
};
int Run(const RunOptions& o, std::ostream& out, std::ostream& err);
int Bench(const RunOptions& o, std::ostream& out, std::ostream& err);

struct DoctorOptions {
  std::string driver;
};
int Doctor(const DoctorOptions& o, std::ostream& out, std::ostream& err);

}  // namespace kpack::cli

#endif  // KPACK_TOOLS_CLI_COMMANDS_H_
