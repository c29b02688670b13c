# Writes OUT (git_commit.inc: k_git_commit, the source tree's commit, "-dirty" when tracked files
# differ from it) at every build, and touches it only when the text changes: provenance.cpp is
# rebuilt after a commit, nothing else. Run by the kvlab_git_commit target (CMakeLists.txt).
#   cmake -DSOURCE_DIR=... -DOUT=... -P cmake/git_commit.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit "unknown")
elseif(dirty)
  set(commit "${commit}-dirty")
endif()
file(WRITE ${OUT}.tmp "// generated at build time by cmake/git_commit.cmake\nconstexpr const char * k_git_commit = \"${commit}\";\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
