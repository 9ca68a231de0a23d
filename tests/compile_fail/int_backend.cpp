#include <ssr/router.hpp>
int main() { ssr::Router<ssr::SoftmaxTopK, ssr::CpuBackend<int>> router; }
