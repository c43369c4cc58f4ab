# Warnings for tensorwire's own targets (not for third-party code).
function(tensorwire_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                                           -Wnon-virtual-dtor -Wno-missing-field-initializers)
  if(TENSORWIRE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
