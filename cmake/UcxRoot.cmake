# Where UCX comes from: TENSORWIRE_UCX_ROOT, by default the libucx-cu12 wheel (UCX 1.22) of the
# Python the build uses (Python_EXECUTABLE: .venv for `make`, the build environment for a
# wheel), as ucxx takes it. Debian 12's UCX 1.13 aborts a listening process when clients
# abandon their connects, in code that UCX 1.18 and 1.22 fixed (docs/reliability.md).
# TENSORWIRE_UCX_ROOT=system (or no libucx wheel) takes the system's UCX from pkg-config: a
# host's own UCX, for InfiniBand. After this file, TENSORWIRE_UCX_ROOT is a prefix or
# "system"; installed beside tensorwireConfig.cmake, which sets it to the build's.
#
# The wheel's pkg-config files carry the prefix of the machine that built them:
# --define-prefix takes it from where they lie.
if(NOT TENSORWIRE_UCX_ROOT AND Python_EXECUTABLE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import libucx, os; print(os.path.dirname(libucx.__file__))"
    OUTPUT_VARIABLE _tensorwire_ucx_root OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _tensorwire_ucx_found ERROR_QUIET)
  if(_tensorwire_ucx_found EQUAL 0 AND EXISTS "${_tensorwire_ucx_root}/lib/pkgconfig/ucx.pc")
    set(TENSORWIRE_UCX_ROOT "${_tensorwire_ucx_root}" CACHE PATH "UCX's prefix (the libucx wheel's)")
  endif()
endif()
if(NOT TENSORWIRE_UCX_ROOT)
  set(TENSORWIRE_UCX_ROOT system)
endif()

# pkg_check_modules(UCX <mode> IMPORTED_TARGET ucx) against TENSORWIRE_UCX_ROOT; `mode` is
# REQUIRED or QUIET.
macro(tensorwire_find_ucx mode)
  if(NOT TENSORWIRE_UCX_ROOT STREQUAL "system")
    # First in pkg-config's search, so that a system UCX (libucx-dev) is never mixed in.
    set(ENV{PKG_CONFIG_PATH} "${TENSORWIRE_UCX_ROOT}/lib/pkgconfig:$ENV{PKG_CONFIG_PATH}")
    set(PKG_CONFIG_ARGN --define-prefix)
    # A build folder configured before against another UCX: pkg_check_modules keeps its
    # answer in the cache unless told to look again.
    if(DEFINED UCX_PREFIX AND NOT UCX_PREFIX STREQUAL TENSORWIRE_UCX_ROOT)
      unset(__pkg_config_checked_UCX CACHE)
    endif()
  endif()
  pkg_check_modules(UCX ${mode} IMPORTED_TARGET ucx)
  set(PKG_CONFIG_ARGN)
endmacro()
