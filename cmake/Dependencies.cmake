# The engines come from Debian packages (scripts/install-deps.sh installs them), except UCX.
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h REQUIRED)
find_package(PkgConfig REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/UcxRoot.cmake)
tensorwire_find_ucx(REQUIRED)                         # the pipe's engine
find_package(OpenSSL REQUIRED)                        # libssl-dev: HMAC for pipe authentication
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)  # libzmq3-dev + cppzmq-dev: the dataflow runners' engine
