# Every dependency comes from a Debian package (or, for CUDA, the toolkit's headers).
# kpackConfig.cmake repeats the ones a consumer of the installed package needs.
include(GNUInstallDirs)
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CUDAToolkit REQUIRED)
# libcrypto, for SHA-256 (Debian: libssl-dev).
find_package(OpenSSL 3.0 REQUIRED COMPONENTS Crypto)
