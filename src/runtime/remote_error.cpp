#include "tensorwire/runtime/remote_error.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

namespace tensorwire {

namespace {

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                           std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

std::string describe(const Failure& f, const std::string& context) {
  std::string head = context.empty() ? std::string() : context + " raised ";
  return head + f.type + ": " + f.message;
}

}  // namespace

RemoteError::RemoteError(Failure failure, const std::string& context)
    : Error(describe(failure, context)), failure_(std::move(failure)), context_(context) {}

RemoteError::RemoteError(std::string type_name, std::string message)
    : RemoteError(Failure{std::move(type_name), std::move(message), {}, {}}) {}

Failure describe_exception(const std::exception_ptr& error) {
  auto named = [](const char* type, const std::exception& e) {
    return Failure{type, e.what(), {}, {}};
  };
  try {
    std::rethrow_exception(error);
  } catch (const RemoteError& e) {
    return e.failure();
  } catch (const KeyError& e) {
    return named("KeyError", e);
  } catch (const ValueError& e) {
    return named("ValueError", e);
  } catch (const TypeError& e) {
    return named("TypeError", e);
  } catch (const TimeoutError& e) {
    return named("TimeoutError", e);
  } catch (const Error& e) {
    return named("RuntimeError", e);
  } catch (const std::exception& e) {
    return Failure{demangle(typeid(e).name()), e.what(), {}, {}};
  } catch (...) {
    const std::type_info* t = abi::__cxa_current_exception_type();
    return Failure{t ? demangle(t->name()) : "unknown", "(not a std::exception)", {}, {}};
  }
}

}  // namespace tensorwire
