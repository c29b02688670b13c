// Eigen, as kvlab's files that use it include it. GCC 12 reads the self-initialized value of
// _mm512_undefined_*() inside the AVX-512 intrinsics as "maybe uninitialized" once Eigen's
// product kernels inline them into a file: a false positive, silenced for the including file
// (the instantiations are there, after this header). Eigen's own OpenMP parallelism is off
// (EIGEN_DONT_PARALLELIZE, CMakeLists.txt).
#pragma once

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <Eigen/Core>
#include <Eigen/Dense>
