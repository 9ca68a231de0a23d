// The test programs' runner; Catch2's implementation is catch_session.cpp, compiled once for them all.
#include "catch_session.hpp"

int main(int argc, char** argv) { return ssr_test::run_catch_session(argc, argv); }
