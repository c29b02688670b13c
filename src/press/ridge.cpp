// RidgeFit: ridge regression with an intercept from streamed sufficient statistics (Eigen).

#include "kvlab/error.h"
#include "kvlab/surrogate.h"
#include "press/eigen.h"

namespace kvlab {

namespace {
using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
}  // namespace

RidgeFit::RidgeFit(int n_in, int n_out)
    : n_in_(n_in),
      n_out_(n_out),
      sxx_(size_t(n_in) * n_in, 0.0),
      sxy_(size_t(n_in) * n_out, 0.0),
      sx_(size_t(n_in), 0.0),
      sy_(size_t(n_out), 0.0) {
    if (n_in < 1 || n_out < 1) throw Error("ridge", "empty regression shape");
}

void RidgeFit::add(const float * x, const float * y, int64_t m) {
    if (m <= 0) return;
    const RowMajorD X = Eigen::Map<const RowMajorF>(x, m, n_in_).cast<double>();
    const RowMajorD Y = Eigen::Map<const RowMajorF>(y, m, n_out_).cast<double>();
    Eigen::Map<RowMajorD>(sxx_.data(), n_in_, n_in_).noalias() += X.transpose() * X;
    Eigen::Map<RowMajorD>(sxy_.data(), n_in_, n_out_).noalias() += X.transpose() * Y;
    Eigen::Map<Eigen::RowVectorXd>(sx_.data(), n_in_) += X.colwise().sum();
    Eigen::Map<Eigen::RowVectorXd>(sy_.data(), n_out_) += Y.colwise().sum();
    n_ += m;
}

void RidgeFit::solve(double alpha, std::vector<float> & w, std::vector<float> & b) const {
    if (n_ < 2) throw Error("ridge", "a fit needs at least two samples");
    const double n = double(n_);
    const Eigen::VectorXd mx = Eigen::Map<const Eigen::VectorXd>(sx_.data(), n_in_) / n;
    const Eigen::VectorXd my = Eigen::Map<const Eigen::VectorXd>(sy_.data(), n_out_) / n;
    // centred normal equations: (Xc^T Xc + alpha I) W^T = Xc^T Yc
    Eigen::MatrixXd A = Eigen::Map<const RowMajorD>(sxx_.data(), n_in_, n_in_) - n * mx * mx.transpose();
    A.diagonal().array() += alpha;
    const Eigen::MatrixXd C = Eigen::Map<const RowMajorD>(sxy_.data(), n_in_, n_out_) - n * mx * my.transpose();
    const Eigen::LDLT<Eigen::MatrixXd> ldlt(A);
    if (ldlt.info() != Eigen::Success) throw Error("ridge", "the normal equations could not be factorised");
    const Eigen::MatrixXd Wt = ldlt.solve(C);  // [n_in][n_out]
    const Eigen::VectorXd bias = my - Wt.transpose() * mx;
    w.resize(size_t(n_out_) * n_in_);
    Eigen::Map<RowMajorF>(w.data(), n_out_, n_in_) = Wt.transpose().cast<float>();
    b.assign(bias.data(), bias.data() + n_out_);
}

}  // namespace kvlab
