# TENSORWIRE_SANITIZE=address,undefined (CI's second pass) or thread (concurrent code).
if(TENSORWIRE_SANITIZE)
  add_compile_options(-fsanitize=${TENSORWIRE_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${TENSORWIRE_SANITIZE})
endif()
