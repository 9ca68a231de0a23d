// Runs Catch2's session on the command line (catch_session.cpp: Catch2's implementation, compiled once
// for every test program) and returns its exit status.
#pragma once

namespace ssr_test {
int run_catch_session(int argc, char** argv);
}
