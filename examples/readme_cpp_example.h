// README.md's C++ example, generated into a function by
// examples/readme_cpp_example.py (//examples:readme_cpp_test runs it).
#ifndef PSERVER_EXAMPLES_README_CPP_EXAMPLE_H_
#define PSERVER_EXAMPLES_README_CPP_EXAMPLE_H_

#include <string>
#include <vector>

#include "cc/core/tensor.h"

// Runs the example as written against the servers at `addresses` (in place
// of its 127.0.0.1:7000 and :7001) and returns its `w`.
pserver::Tensor RunReadmeCppExample(const std::vector<std::string>& addresses);

#endif  // PSERVER_EXAMPLES_README_CPP_EXAMPLE_H_
