#include <ssr/eigen.hpp>
int main() {
  Eigen::MatrixXf logits(4, 8);  // column-major
  auto v = ssr::view(logits);
  return static_cast<int>(v.rows);
}
