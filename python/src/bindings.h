// One registration function per bound subsystem; module.cpp calls each once.
#pragma once

// convert.h brings nanobind with the std::string caster every binding must see.
#include "convert.h"
#include "tensorwire/runtime/remote_error.h"

namespace tensorwire::py {
void bind_errors(nanobind::module_& m);
// A Python exception described for delivery elsewhere (errors.cpp): type ("KeyError" for
// builtins, "module.QualName" otherwise), message, traceback and, `with_payload`, the
// pickled exception (only for a runner's own forked workers).
Failure describe_python_exception(nanobind::handle exc, bool with_payload);
// What a runner's worker failed with, for its parent (takes the GIL): a Python exception
// with its payload, a C++ one as describe_exception does.
Failure describe_worker_failure(std::exception_ptr error);
void bind_tensordict(nanobind::module_& m);
void bind_pipe(nanobind::module_& m);
void bind_dataflow(nanobind::module_& m);
void bind_inference(nanobind::module_& m);
// Reports of the library's own threads to Python's logging (log_py.cpp).
void bind_log(nanobind::module_& m);
}  // namespace tensorwire::py
