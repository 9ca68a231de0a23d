// Catch2's implementation (its session, reporters and assertion handling), compiled once and linked into
// every test program, whose runner (main.cpp, or one of its own) calls run_catch_session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

int ssr_test::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
