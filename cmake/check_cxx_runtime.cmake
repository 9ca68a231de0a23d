# Fails, removing MODULE, when it does not load a shared C++ runtime (libstdc++ or libc++): the compiler
# linked its own copy into it, beside the one torch has loaded. Built so by a GCC under /opt/gcc, the
# operators crashed whenever they formatted an error message. Run after linking:
#   cmake -DMODULE=<file> -DREADELF=<readelf> -P check_cxx_runtime.cmake
execute_process(COMMAND "${READELF}" -d "${MODULE}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE failed)
if(failed)
  message(WARNING "check_cxx_runtime: ${READELF} could not read ${MODULE}; its C++ runtime is not checked")
elseif(NOT dynamic MATCHES "NEEDED[^\n]*(libstdc\\+\\+|libc\\+\\+)\\.so")
  file(REMOVE "${MODULE}")  # so that the next build links it again
  message(FATAL_ERROR "${MODULE} does not load a shared C++ runtime (no libstdc++.so or libc++.so among its "
                      "needed libraries): the compiler linked a copy of its own into it, beside torch's, and "
                      "operators built so have crashed formatting error messages. Build with a compiler that "
                      "links the runtime shared, e.g. CXX=/usr/bin/g++.")
endif()
