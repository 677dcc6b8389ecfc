# The plugin support library (oar/plugin_support.h): include() this file, then link
# oar_plugin_support. Static, position-independent, hidden visibility: each plugin gets its own
# copy and exports none of it. Used by the reference plugins and by `oar new-backend` projects.
#
# Two layouts: Oar's sources (reference_backends/common/{include,src}, device_api.h in
# interface/include) and the oar package (oar/plugin_support/{src,this file}, both headers in
# oar/include, the directory `oar --include-dir` prints).
if(NOT TARGET oar_plugin_support)
  get_filename_component(_oar_ps_dir "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)
  if(EXISTS "${_oar_ps_dir}/include/oar/plugin_support.h")
    set(_oar_ps_includes "${_oar_ps_dir}/include" "${_oar_ps_dir}/../../interface/include")
  else()
    set(_oar_ps_includes "${_oar_ps_dir}/../include")
  endif()
  add_library(oar_plugin_support STATIC
    "${_oar_ps_dir}/src/errors.c"
    "${_oar_ps_dir}/src/attrs.c"
    "${_oar_ps_dir}/src/descriptors.c"
    "${_oar_ps_dir}/src/geometry.c"
    "${_oar_ps_dir}/src/dtypes.c")
  target_include_directories(oar_plugin_support PUBLIC ${_oar_ps_includes})
  set_target_properties(oar_plugin_support PROPERTIES
    C_STANDARD 99
    C_STANDARD_REQUIRED ON
    C_EXTENSIONS OFF
    POSITION_INDEPENDENT_CODE ON
    C_VISIBILITY_PRESET hidden)
  if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(oar_plugin_support PRIVATE -Wall -Wextra -Wshadow -Wstrict-prototypes)
  endif()
endif()
