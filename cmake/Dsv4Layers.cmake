# The layers of src/ (docs/ARCHITECTURE.md), enforced by the build.
#
# Every folder under src/ is a layer with a level. A target sees the headers of its own folder
# and of the libraries it links (PUBLIC links transitively), nothing else: src/ itself is never
# on an include path. Instead each folder has an include view, ${PROJECT_BINARY_DIR}/layers/<f>/,
# holding one symbolic link <f> -> src/<f>, and a layered target puts its folder's view on its
# include path (PUBLIC for a library, so that its users see it too). An #include "engine/engine.h"
# in a library that does not link dsv4_engine therefore finds no file.
#
#   dsv4_layer(TARGET [FOLDER f] [SOURCES ...])
#                                 makes TARGET layered (f: the src/ folder of the calling
#                                 CMakeLists.txt by default); dsv4_library() and the GPU
#                                 libraries call it. SOURCES (default: the target's) name the
#                                 headers the probes include: x.cc or x.cu -> x.h where it exists.
#   dsv4_check_layers()           at the end of configuration: a layered target links layered
#                                 libraries of its own folder or of lower levels only.
#   dsv4_layering_tests()         one ctest per layered target (cmake/Dsv4LayerProbe.cmake): the
#                                 headers of every folder it may not see fail to preprocess with
#                                 the target's own include path, and the headers of every library
#                                 it links preprocess; and no file of src/ includes "../...".

# Level of each folder: a library depends only on libraries of lower levels (or of its own folder).
# Folders of one level never see each other: the executors and the engine meet in executor/.
set(DSV4_LAYER_LEVELS common=0 text=1 numerics=1 model=2 kvcache=3 executor=4 cpu=5 cuda=5 engine=5 server=6 cli=7)

function(_dsv4_layer_level folder out)
  foreach(entry IN LISTS DSV4_LAYER_LEVELS)
    if(entry MATCHES "^${folder}=([0-9]+)$")
      set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "dsv4: src/${folder} has no level in DSV4_LAYER_LEVELS (cmake/Dsv4Layers.cmake)")
endfunction()

function(dsv4_layer target)
  cmake_parse_arguments(ARG "" "FOLDER" "SOURCES" ${ARGN})
  set(folder "${ARG_FOLDER}")
  if(NOT folder)
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}/src" "${CMAKE_CURRENT_SOURCE_DIR}")
    string(REGEX REPLACE "/.*" "" folder "${rel}")
  endif()
  _dsv4_layer_level(${folder} level)
  set(view "${PROJECT_BINARY_DIR}/layers/${folder}")
  if(NOT IS_SYMLINK "${view}/${folder}")
    file(MAKE_DIRECTORY "${view}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/src/${folder}" "${view}/${folder}" SYMBOLIC)
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_include_directories(${target} PRIVATE "${view}")
  else()
    target_include_directories(${target} PUBLIC "${view}")
  endif()
  # The headers named like the target's sources (x.cc or x.cu -> x.h): what the probes include.
  set(sources ${ARG_SOURCES})
  if(NOT sources)
    get_target_property(sources ${target} SOURCES)
  endif()
  set(headers)
  foreach(src IN LISTS sources)
    get_filename_component(abs "${src}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    string(REGEX REPLACE "\\.(cc|cu)$" ".h" header "${abs}")
    if(NOT header STREQUAL abs AND EXISTS "${header}")
      file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}/src" "${header}")
      list(APPEND headers "${rel}")
    endif()
  endforeach()
  set_target_properties(${target} PROPERTIES DSV4_LAYER ${folder} DSV4_LAYER_HEADERS "${headers}")
  set_property(GLOBAL APPEND PROPERTY DSV4_LAYERED_TARGETS ${target})
endfunction()

# The layered targets among ARGN (a link list: other entries are external or generator expressions).
function(_dsv4_layered out)
  set(layered)
  foreach(item IN LISTS ARGN)
    if(TARGET "${item}")
      get_target_property(folder ${item} DSV4_LAYER)
      if(folder)
        list(APPEND layered ${item})
      endif()
    endif()
  endforeach()
  set(${out} ${layered} PARENT_SCOPE)
endfunction()

# The layered libraries `target` links directly (PUBLIC and PRIVATE).
function(_dsv4_layer_direct_deps target out)
  get_target_property(links ${target} LINK_LIBRARIES)
  _dsv4_layered(deps ${links})
  set(${out} ${deps} PARENT_SCOPE)
endfunction()

# The layered libraries whose headers `target` sees: its direct links, then their PUBLIC links,
# transitively (a PRIVATE link of a static library shows up as $<LINK_ONLY:...> and is skipped).
function(_dsv4_layer_closure target out)
  _dsv4_layer_direct_deps(${target} todo)
  set(seen)
  while(todo)
    list(POP_FRONT todo dep)
    if(NOT dep IN_LIST seen)
      list(APPEND seen ${dep})
      get_target_property(links ${dep} INTERFACE_LINK_LIBRARIES)
      _dsv4_layered(next ${links})
      list(APPEND todo ${next})
    endif()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(dsv4_check_layers)
  get_property(targets GLOBAL PROPERTY DSV4_LAYERED_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(folder ${target} DSV4_LAYER)
    _dsv4_layer_level(${folder} level)
    _dsv4_layer_direct_deps(${target} deps)
    foreach(dep IN LISTS deps)
      get_target_property(dep_folder ${dep} DSV4_LAYER)
      _dsv4_layer_level(${dep_folder} dep_level)
      if(NOT dep_folder STREQUAL folder AND NOT dep_level LESS level)
        message(FATAL_ERROR "dsv4: ${target} (src/${folder}, level ${level}) links ${dep} (src/${dep_folder}, "
                            "level ${dep_level}): a layer may use only layers of lower levels (docs/ARCHITECTURE.md)")
      endif()
    endforeach()
  endforeach()
endfunction()

function(dsv4_layering_tests)
  get_property(targets GLOBAL PROPERTY DSV4_LAYERED_TARGETS)
  # One header of each folder for the probes that must fail.
  set(folders)
  foreach(target IN LISTS targets)
    get_target_property(folder ${target} DSV4_LAYER)
    get_target_property(headers ${target} DSV4_LAYER_HEADERS)
    if(headers AND NOT DEFINED first_header_${folder})
      list(GET headers 0 first_header_${folder})
      list(APPEND folders ${folder})
    endif()
  endforeach()
  list(JOIN CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES "|" implicit)
  foreach(target IN LISTS targets)
    # The real CUDA libraries' include paths hold $<COMPILE_LANGUAGE:...>, which a test command
    # cannot evaluate; their _sim twins have the same folders and links.
    get_target_property(dirs ${target} INCLUDE_DIRECTORIES)
    if(dirs MATCHES "COMPILE_LANGUAGE")
      continue()
    endif()
    get_target_property(folder ${target} DSV4_LAYER)
    get_target_property(visible ${target} DSV4_LAYER_HEADERS)
    if(NOT visible)
      set(visible)
    endif()
    set(visible_folders ${folder})
    _dsv4_layer_closure(${target} closure)
    foreach(dep IN LISTS closure)
      get_target_property(dep_folder ${dep} DSV4_LAYER)
      get_target_property(dep_headers ${dep} DSV4_LAYER_HEADERS)
      list(APPEND visible_folders ${dep_folder})
      if(dep_headers)
        list(APPEND visible ${dep_headers})
      endif()
    endforeach()
    set(hidden)
    foreach(other IN LISTS folders)
      if(NOT other IN_LIST visible_folders)
        list(APPEND hidden ${first_header_${other}})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES visible)
    list(JOIN visible "," visible_arg)
    list(JOIN hidden "," hidden_arg)
    add_test(NAME layering_${target}
             COMMAND ${CMAKE_COMMAND} "-DCOMPILER=${CMAKE_CXX_COMPILER}"
                     "-DINCLUDES=$<JOIN:$<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>,|>"
                     "-DDEFINES=$<JOIN:$<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>,|>"
                     "-DIMPLICIT=${implicit}" "-DVISIBLE=${visible_arg}" "-DHIDDEN=${hidden_arg}"
                     "-DWORK_DIR=${PROJECT_BINARY_DIR}/layering/${target}"
                     -P ${PROJECT_SOURCE_DIR}/cmake/Dsv4LayerProbe.cmake)
    set_tests_properties(layering_${target} PROPERTIES LABELS layering)
  endforeach()
  add_test(NAME layering_relative_includes
           COMMAND ${CMAKE_COMMAND} "-DSCAN_DIR=${PROJECT_SOURCE_DIR}/src" -P ${PROJECT_SOURCE_DIR}/cmake/Dsv4LayerProbe.cmake)
  set_tests_properties(layering_relative_includes PROPERTIES LABELS layering)
endfunction()
