// One registration function per bound subsystem; module.cpp calls each once.
#pragma once

#include <nanobind/nanobind.h>

namespace tensorwire::py {
void bind_errors(nanobind::module_& m);
void bind_tensordict(nanobind::module_& m);
void bind_pipe(nanobind::module_& m);
void bind_dataflow(nanobind::module_& m);
void bind_inference(nanobind::module_& m);
}  // namespace tensorwire::py
