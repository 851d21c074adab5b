# One layering test (dsv4_layering_tests in cmake/Dsv4Layers.cmake), run as cmake -P: the
# preprocessor, given a target's include path and compile definitions, must
#   - find every header of VISIBLE (the headers of the target and of the libraries it links):
#     one probe source includes them all and must preprocess;
#   - not find any header of HIDDEN (one header of each src/ folder the target may not see):
#     a probe source per header must fail, and fail because that very header was not found.
# Arguments (-D): COMPILER; INCLUDES, DEFINES, IMPLICIT (the compiler's own include directories,
# left out) separated by |; VISIBLE, HIDDEN (paths under src/) separated by commas; WORK_DIR.
# With -DSCAN_DIR=DIR instead: no file under DIR may include a quoted path with "../" (looked up
# next to the including file first, it would bypass the include views).
cmake_minimum_required(VERSION 3.22)

if(DEFINED SCAN_DIR)
  file(GLOB_RECURSE files "${SCAN_DIR}/*.h" "${SCAN_DIR}/*.cc" "${SCAN_DIR}/*.cu" "${SCAN_DIR}/*.cuh")
  set(problems "")
  foreach(file IN LISTS files)
    file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]*\\.\\./")
    foreach(line IN LISTS lines)
      string(APPEND problems "${file}: ${line}\n")
    endforeach()
  endforeach()
  if(problems)
    message(FATAL_ERROR "includes that climb out of their folder:\n${problems}")
  endif()
  list(LENGTH files num_files)
  message(STATUS "layering: no \"../\" include in ${num_files} files")
  return()
endif()

string(REPLACE "|" ";" includes "${INCLUDES}")
string(REPLACE "|" ";" implicit "${IMPLICIT}")
string(REPLACE "|" ";" defines "${DEFINES}")
string(REPLACE "," ";" visible "${VISIBLE}")
string(REPLACE "," ";" hidden "${HIDDEN}")
if(NOT visible)
  message(FATAL_ERROR "layering probe: no visible header to check (the test would prove nothing)")
endif()

set(flags -std=c++20 -E)
foreach(dir IN LISTS includes)
  if(NOT dir IN_LIST implicit)
    list(APPEND flags "-I${dir}")
  endif()
endforeach()
foreach(definition IN LISTS defines)
  list(APPEND flags "-D${definition}")
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Preprocesses `text` as probe `name`; sets rc and log in the caller's scope.
function(preprocess name text)
  file(WRITE "${WORK_DIR}/${name}.cc" "${text}")
  execute_process(COMMAND "${COMPILER}" ${flags} "${WORK_DIR}/${name}.cc" -o "${WORK_DIR}/${name}.i"
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(rc "${result}" PARENT_SCOPE)
  set(log "${out}" PARENT_SCOPE)
endfunction()

set(problems "")
set(text "")
foreach(header IN LISTS visible)
  string(APPEND text "#include \"${header}\"\n")
endforeach()
preprocess(visible "${text}")
if(NOT rc EQUAL 0)
  string(APPEND problems "headers it links could not be included:\n${log}\n")
endif()

set(index 0)
foreach(header IN LISTS hidden)
  math(EXPR index "${index} + 1")
  preprocess(hidden_${index} "#include \"${header}\"\n")
  string(REPLACE "." "\\." pattern "${header}")
  if(rc EQUAL 0)
    string(APPEND problems "${header} was found, but the target does not link its library\n")
  elseif(NOT log MATCHES "${pattern}: No such file or directory" AND NOT log MATCHES "'${pattern}' file not found")
    string(APPEND problems "${header}: the probe failed for another reason than a missing header:\n${log}\n")
  endif()
endforeach()

list(LENGTH visible num_visible)
list(LENGTH hidden num_hidden)
if(problems)
  message(FATAL_ERROR "layering violated:\n${problems}")
endif()
message(STATUS "layering: ${num_visible} linked headers found, ${num_hidden} other folders' headers not found")
