# Every engine comes from Debian packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)   # libucx-dev: the pipe's engine
find_package(OpenSSL REQUIRED)                        # libssl-dev: HMAC for pipe authentication
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)  # libzmq3-dev + cppzmq-dev: the dataflow runners' engine
