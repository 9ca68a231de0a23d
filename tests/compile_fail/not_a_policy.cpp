#include <ssr/router.hpp>
struct NotAPolicy {};
int main() { ssr::Router<NotAPolicy> router; }
