// Linked into every kpack fuzz target.
//
// The code under test is compiled with the build's global -fsanitize=...,undefined, which
// leaves UBSan reports recoverable: they would print and carry on, and libFuzzer would
// never save the input. Making every report fatal here turns each one into a crash,
// whatever flags the libraries were built with.

extern "C" const char* __ubsan_default_options() {  // NOLINT(readability-identifier-naming)
  return "halt_on_error=1:print_stacktrace=1";
}
