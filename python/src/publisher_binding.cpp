#include "bindings.hpp"

// The publisher binding goes here.
void bind_publisher(nanobind::module_&) {}
