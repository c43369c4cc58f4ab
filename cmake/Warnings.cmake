# Warnings for tensorwire's own targets (not for third-party code).
function(tensorwire_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic
                                           -Wnon-virtual-dtor -Wno-missing-field-initializers)
  # clang has no -Wshadow=local; its -Wshadow is the closest (locals and globals).
  target_compile_options(${target} PRIVATE $<IF:$<CXX_COMPILER_ID:GNU>,-Wshadow=local,-Wshadow>)
  if(TENSORWIRE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
