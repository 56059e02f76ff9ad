# moeplan_embed_files(OUT NAMESPACE COMMENT FILES...): a source file OUT that
# compiles FILES into the library that lists it (moeplan/base/embedded.h),
# regenerated when any of them changes.
function(moeplan_embed_files out namespace comment)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} -DNAMESPACE=${namespace} "-DFILES=${ARGN}"
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
    DEPENDS ${ARGN} ${PROJECT_SOURCE_DIR}/cmake/EmbedFiles.cmake
    COMMENT "${comment}"
    VERBATIM)
endfunction()
