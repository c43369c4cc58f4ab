# Every engine comes from Debian packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h REQUIRED)
