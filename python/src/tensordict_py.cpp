// tensorwire.TensorDict and NonTensorStack: arguments and methods; values go through the
// conversion module (convert.h), pickling through tensorwire/_pickling.py.
#include "bindings.h"
#include "convert.h"
#include "gil.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "tensorwire/tensorwire.h"

namespace tensorwire::py {

namespace {

// Arguments taken as tensordict takes them, with a one-line error naming the argument
// (nanobind's own is a dump of every overload).
Shape batch_arg(nb::handle v) {
  if (v.is_none()) return {};
  if (nb::isinstance<nb::int_>(v)) return {nb::cast<int64_t>(v)};
  Shape out;
  if (nb::isinstance<nb::sequence>(v) && !nb::isinstance<nb::str>(v)) {
    for (nb::handle d : v) {
      if (!nb::isinstance<nb::int_>(d)) break;
      out.push_back(nb::cast<int64_t>(d));
    }
    if (out.size() == nb::len(v)) return out;
  }
  throw TypeError("batch_size must be None, an int or a sequence of ints, got " +
                  nb::cast<std::string>(nb::repr(v)));
}

std::optional<Device> device_arg(nb::handle v) {
  if (v.is_none()) return std::nullopt;
  // A str or a torch.device (whose str() is "cpu", "cuda:0", ...).
  if (nb::isinstance<nb::str>(v) || py_type(v) == "device") {
    std::string name = nb::cast<std::string>(nb::str(v));
    if (auto d = parse_device(name)) return d;
    throw ValueError("unknown device '" + name + "' (expected 'cpu' or 'cuda:N')");
  }
  throw TypeError("device must be None, a str or a torch.device, got " + py_type(v));
}

// What a call that releases the GIL works on: a copy of the structure (the leaves share
// their storages), since another thread may add or remove entries meanwhile.
TensorDict snapshot(const PyTensorDict& td) {
  return td.td();
}

bool only_tensors(const TensorDict& td) {
  for (const Key& k : td.keys(true, true))
    if (!td.entry(k).is_tensor()) return false;
  return true;
}

size_t alignment_arg(nb::handle v) {
  const int64_t a = int_arg(v, "alignment");
  if (a < 8 || (a & (a - 1)) != 0)
    throw ValueError("alignment must be a power of two of at least 8, got " + std::to_string(a));
  return static_cast<size_t>(a);
}

// The file system's bytes of a path, as os.fsencode gives them: a name that is not UTF-8
// (os.listdir's surrogate-escaped str, or bytes) names the same file.
std::string path_arg(nb::handle v) {
  if (!nb::isinstance<nb::str>(v) && !nb::isinstance<nb::bytes>(v) && !nb::hasattr(v, "__fspath__"))
    throw TypeError("path must be a str, bytes or an os.PathLike, got " + py_type(v));
  nb::bytes b = nb::borrow<nb::bytes>(nb::module_::import_("os").attr("fsencode")(v));
  return std::string(b.c_str(), b.size());
}

// `value` set at `key` of `self`, converted as an entry of the dict it goes into (the
// parent's batch size and device, as tensordict). The conversion runs Python code (a
// tensor's __dlpack__, tensordict's own) that may change or drop the dict `self` views: the
// dict is looked up again once it is done, never held across it.
void set_value(PyTensorDict& self, nb::handle key, nb::handle value) {
  Key k = to_key(key);
  Shape batch;
  std::optional<Device> device;
  {
    const TensorDict& td = self.td();
    const TensorDict* parent = &td;
    if (k.size() > 1 && td.contains(k.parent())) parent = &td.get_tensordict(k.parent());
    batch = parent->batch_size();
    device = parent->device();
  }
  Entry e = to_entry(value, batch, device, k);
  self.td().set(k, std::move(e));
}

// Element-wise ==, as tensordict: a TensorDict of bool leaves (a non-tensor compares as
// one value, broadcast over the batch). `other` is a TensorDict with the same keys or a
// value every leaf is compared with.
PyTensorDict compare(const PyTensorDict& self, nb::handle other, bool equal) {
  // Copies of the structures (leaves shared): numpy runs Python code between the leaves.
  const TensorDict a = snapshot(self);
  const PyTensorDict* b =
      nb::isinstance<PyTensorDict>(other) ? &nb::cast<PyTensorDict&>(other) : nullptr;
  const std::optional<TensorDict> b_td = b ? std::optional<TensorDict>(snapshot(*b)) : std::nullopt;
  if (b_td) {  // as tensordict: the same batch size and keys, nothing broadcast or ignored
    if (b_td->batch_size() != a.batch_size())
      throw ValueError("cannot compare TensorDicts of batch sizes " + shape_str(a.batch_size()) +
                       " and " + shape_str(b_td->batch_size()));
    for (const Key& k : b_td->keys(true, true))
      if (!a.contains(k))
        throw KeyError("key " + k.str() + " is in the right-hand TensorDict only");
  }
  nb::module_ np = nb::module_::import_("numpy");
  TensorDict out(a.batch_size(), a.device());
  for (const Key& k : a.keys(true, true)) {
    nb::object x = from_entry(a.entry(k), self, k);
    nb::object y = b ? from_entry(b_td->entry(k), *b, k) : nb::borrow(other);
    nb::object cmp = nb::steal(PyObject_RichCompare(x.ptr(), y.ptr(), equal ? Py_EQ : Py_NE));
    if (!cmp.ptr()) throw nb::python_error();
    nb::object r = np.attr("asarray")(cmp);
    if (nb::cast<size_t>(r.attr("ndim")) == 0)
      r = np.attr("full")(nb::tuple(nb::cast(a.batch_size())), r);
    out.set(k, *to_tensor(r.attr("astype")("bool")));
  }
  return PyTensorDict(std::move(out));
}

}  // namespace

void bind_tensordict(nb::module_& m) {
  nb::class_<PyNonTensorStack>(m, "NonTensorStack",
                               "One JSON value per batch element (tensordict's NonTensorStack).")
      .def(
          "__init__",
          [](PyNonTensorStack* self, nb::handle values, std::optional<Shape> batch_size,
             int64_t stack_dim) {
            new (self) PyNonTensorStack{NonTensorStack::from_nested(
                to_json(values, "NonTensorStack value"), std::move(batch_size), stack_dim)};
          },
          nb::arg("values"), nb::arg("batch_size").none() = nb::none(), nb::arg("stack_dim") = 0)
      .def_prop_ro(
          "batch_size",
          [](const PyNonTensorStack& s) { return nb::tuple(nb::cast(s.stack.batch_size)); })
      .def_prop_ro("stack_dim", [](const PyNonTensorStack& s) { return s.stack.stack_dim; })
      .def("tolist", [](const PyNonTensorStack& s) { return from_json(s.stack.to_nested()); })
      .def("__len__", [](const PyNonTensorStack& s) { return s.stack.batch_size[0]; })
      .def("__eq__",
           [](const PyNonTensorStack& a, nb::handle b) {
             return nb::isinstance<PyNonTensorStack>(b) &&
                    a.stack == nb::cast<PyNonTensorStack&>(b).stack;
           })
      .def("__repr__", [](const PyNonTensorStack& s) {
        return "NonTensorStack(" + nb::cast<std::string>(nb::repr(from_json(s.stack.to_nested()))) +
               ", batch_size=" + shape_str(s.stack.batch_size) + ")";
      });

  nb::class_<PyTensorDict>(m, "TensorDict",
                           "An insertion-ordered nested map of arrays sharing leading batch dims.")
      .def(
          "__init__",
          [](PyTensorDict* self, nb::handle source, nb::handle batch_size, nb::handle device,
             std::optional<std::vector<std::optional<std::string>>> names) {
            std::optional<Device> dev = device_arg(device);
            TensorDict td(batch_arg(batch_size), dev);
            if (names) td.set_names(*names);
            if (nb::isinstance<nb::dict>(source)) {
              TensorDict filled =
                  tensordict_from(source, td.batch_size(), dev, "TensorDict(source)");
              filled.set_names(td.names());
              td = std::move(filled);
            } else if (!source.is_none()) {
              // A TensorDict's entries (shared, not copied) in a dict of the batch size and
              // device given here, as tensordict: none given is no batch dims, not the
              // source's, and an entry that does not fit is refused.
              const TensorDict src = tensordict_from(source, {}, dev, "TensorDict(source)");
              for (const auto& [name, e] : src.items()) td.set(Key(name), e);
            }
            new (self) PyTensorDict(std::move(td));
          },
          nb::arg("source").none() = nb::none(), nb::arg("batch_size").none() = nb::none(),
          nb::arg("device").none() = nb::none(), nb::arg("names").none() = nb::none(),
          "A dict's values converted (docs/conversion.md), or a TensorDict's (tensorwire's or\n"
          "tensordict's) entries shared, in a dict of `batch_size` (None: no batch dims, as\n"
          "tensordict, also for a TensorDict source) on `device`.")
      .def("__getitem__",
           [](const PyTensorDict& self, nb::handle key) -> nb::object {
             if (nb::isinstance<nb::int_>(key))  // out of range: IndexError (errors.cpp)
               return nb::cast(PyTensorDict(self.td().index(int_arg(key, "index"))));
             if (nb::isinstance<nb::slice>(key)) {
               const TensorDict& td = self.td();
               if (td.batch_size().empty())
                 throw ValueError("cannot slice a TensorDict with no batch dimension");
               auto [start, stop, step, n] =
                   nb::borrow<nb::slice>(key).compute(static_cast<size_t>(td.batch_size()[0]));
               (void)stop;
               return nb::cast(
                   PyTensorDict(td.slice(static_cast<int64_t>(start), static_cast<int64_t>(n),
                                         static_cast<int64_t>(step))));
             }
             Key k = to_key(key);
             return from_entry(self.td().entry(k), self, k);
           })
      .def(
          "get",
          [](const PyTensorDict& self, nb::handle key, nb::handle default_) -> nb::object {
            Key k = to_key(key);
            if (!self.td().contains(k)) return nb::borrow(default_);
            return from_entry(self.td().entry(k), self, k);
          },
          nb::arg("key"), nb::arg("default").none() = nb::none())
      .def(
          "__setitem__",
          [](PyTensorDict& self, nb::handle key, nb::handle value) { set_value(self, key, value); },
          nb::arg("key"), nb::arg("value").none())
      .def(
          "set",
          [](PyTensorDict& self, nb::handle key, nb::handle value) {
            set_value(self, key, value);
            return self;
          },
          nb::arg("key"), nb::arg("value").none())
      .def("__delitem__", [](PyTensorDict& self, nb::handle key) { self.td().erase(to_key(key)); })
      .def("__contains__",
           [](const PyTensorDict& self, nb::handle key) {
             return (nb::isinstance<nb::str>(key) || nb::isinstance<nb::tuple>(key)) &&
                    self.td().contains(to_key(key));
           })
      // As tensordict: the length of the first batch dim (0 without one) and iteration
      // along it (__bool__, below, refuses a truth value).
      .def(
          "__len__",
          [](const PyTensorDict& self) {
            const Shape& b = self.td().batch_size();
            return b.empty() ? int64_t{0} : b[0];
          },
          "The size of the first batch dim; 0 with no batch dims (as tensordict).")
      .def(
          "__iter__",
          [](const PyTensorDict& self) {
            if (self.td().batch_size().empty())
              throw TypeError(
                  "iteration over a TensorDict with no batch dimension (iterate over keys())");
            nb::list out;
            for (TensorDict& t : self.td().unbind(0)) out.append(PyTensorDict(std::move(t)));
            return nb::iter(out);
          },
          "The rows along the first batch dim (views, as unbind(0)); keys() lists the keys.")
      .def(
          "is_empty", [](const PyTensorDict& self) { return self.td().keys(true, true).empty(); },
          "True when no leaf is in it (nested dicts without leaves do not count), as tensordict.")
      .def(
          "keys",
          [](const PyTensorDict& self, bool include_nested, bool leaves_only) {
            return key_list(self.td().keys(include_nested, leaves_only));
          },
          nb::arg("include_nested") = false, nb::arg("leaves_only") = false)
      .def(
          "items",
          [](const PyTensorDict& self, bool include_nested, bool leaves_only) {
            nb::list out;
            for (const Key& k : self.td().keys(include_nested, leaves_only))
              out.append(nb::make_tuple(from_key(k), from_entry(self.td().entry(k), self, k)));
            return out;
          },
          nb::arg("include_nested") = false, nb::arg("leaves_only") = false)
      .def("values",
           [](const PyTensorDict& self) {
             nb::list out;
             for (const Key& k : self.td().keys())
               out.append(from_entry(self.td().entry(k), self, k));
             return out;
           })
      .def_prop_ro(
          "batch_size",
          [](const PyTensorDict& self) { return nb::tuple(nb::cast(self.td().batch_size())); })
      .def_prop_ro("batch_dims", [](const PyTensorDict& self) { return self.td().batch_dims(); })
      .def_prop_ro("device",
                   [](const PyTensorDict& self) -> nb::object {
                     const auto& d = self.td().device();
                     return d ? nb::object(nb::str(d->str().c_str())) : nb::none();
                   })
      .def_prop_ro("names", [](const PyTensorDict& self) { return self.td().names(); })
      .def(
          "consolidate",
          [](const PyTensorDict& self, nb::handle alignment) {
            const TensorDict td = snapshot(self);
            ConsolidateOptions options{.alignment = alignment_arg(alignment)};
            NoGil nogil;
            return PyTensorDict(consolidate(td, options));
          },
          nb::arg("alignment").none() = 8,
          "A locked copy whose leaves are views into one new storage, laid out as tensordict's\n"
          "consolidate() does (each leaf at a multiple of `alignment` bytes); returned as is\n"
          "when already consolidated. ValueError for nesting deeper than 256 levels.")
      .def("is_consolidated",
           [](const PyTensorDict& self) { return is_consolidated_root(self.td()); })
      .def_prop_ro("is_locked", [](const PyTensorDict& self) { return self.td().is_locked(); })
      .def("lock_",
           [](PyTensorDict& self) {
             self.td().lock_();
             return self;
           })
      .def("unlock_",
           [](PyTensorDict& self) {
             self.td().unlock_();
             return self;
           })
      .def_prop_ro(
          "storage",
          [](const PyTensorDict& self) -> nb::object {
            const auto& c = self.td().consolidated();
            if (!c) return nb::none();
            return to_numpy(Tensor::view(c->storage, 0, {static_cast<int64_t>(c->storage.nbytes())},
                                         DType::UInt8));
          },
          "The consolidated storage as a uint8 array (None when not consolidated).")
      .def_prop_ro(
          "metadata",
          [](const PyTensorDict& self) -> nb::object {
            const Json* m = self.td().consolidated_metadata();
            return m ? from_json(*m) : nb::none();
          },
          "The consolidated metadata (tensordict's format), or None.")
      .def(
          "save",
          [](const PyTensorDict& self, nb::handle path, nb::handle alignment) {
            const TensorDict td = snapshot(self);
            std::string p = path_arg(path);
            ConsolidateOptions options{.alignment = alignment_arg(alignment)};
            NoGil nogil;
            save(td, p, options);
          },
          nb::arg("path").none(), nb::arg("alignment").none() = 8,
          "Writes the consolidated storage, its metadata JSON and the JSON's length to `path`\n"
          "(tensordict's consolidated-file layout, docs/protocol.md section 8), atomically.")
      .def("clone",
           [](const PyTensorDict& self) {
             const TensorDict td = snapshot(self);
             NoGil nogil;
             return PyTensorDict(td.clone());
           })
      .def("copy", [](const PyTensorDict& self) { return PyTensorDict(TensorDict(self.td())); })
      .def("_same_views",  // the same keys, each leaf viewing the very same bytes alike
           [](const PyTensorDict& self, const PyTensorDict& other) {
             const TensorDict &a = self.td(), &b = other.td();
             const std::vector<Key> keys = b.keys(true, true);
             if (a.keys(true, true) != keys) return false;
             for (const Key& k : keys) {
               const Entry &ea = a.entry(k), &eb = b.entry(k);
               if (ea.is_tensor() != eb.is_tensor()) return false;
               if (!eb.is_tensor()) continue;
               const Tensor &x = ea.tensor(), &y = eb.tensor();
               if (x.data() != y.data() || x.dtype() != y.dtype() || x.shape() != y.shape() ||
                   x.strides() != y.strides())
                 return false;
             }
             return true;
           })
      .def("update_",
           [](PyTensorDict& self, nb::handle other) {
             if (nb::isinstance<PyTensorDict>(other)) {
               const TensorDict src = snapshot(nb::cast<PyTensorDict&>(other));
               TensorDict& td = self.td();
               if (!only_tensors(src)) {
                 td.update_(src);  // its non-tensor values replace entries of `td`
                 return self;
               }
               // The tensors are written through a copy of the structure: their storages
               // are this dict's.
               TensorDict into = td;
               NoGil nogil;
               into.update_(src);
             } else {
               // Converted first: that runs Python code, which may change or drop the dict
               // `self` views (looked up again after it, as set_value does). No batch dims:
               // a leaf need only broadcast to its destination (update_ checks that).
               const std::optional<Device> device = self.td().device();
               TensorDict src = tensordict_from(other, {}, device, "update_");
               self.td().update_(src);
             }
             return self;
           })
      .def(
          "select",
          [](const PyTensorDict& self, nb::args keys, bool strict) {
            std::vector<Key> ks;
            for (nb::handle k : keys) ks.push_back(to_key(k));
            return PyTensorDict(self.td().select(ks, strict));
          },
          nb::arg("keys"), nb::kw_only(), nb::arg("strict") = true)
      .def(
          "unbind",
          [](const PyTensorDict& self, int64_t dim) {
            nb::list out;
            for (TensorDict& t : self.td().unbind(dim))
              out.append(nb::cast(PyTensorDict(std::move(t))));
            return out;
          },
          nb::arg("dim") = 0)
      .def(
          "torch", [](const PyTensorDict& self) { return to_torch_tree(self.td()); },
          "A nested dict of torch tensors sharing memory with this TensorDict.")
      .def_static(
          "from_tensordict",
          [](nb::handle td) {
            if (!is_tensordict_lib(td))
              throw TypeError("from_tensordict: expected a tensordict.TensorDict, got " +
                              py_type(td));
            return PyTensorDict(tensordict_from(td, {}, {}, "from_tensordict"));
          },
          nb::arg("td"),
          "A TensorDict over the same leaf memory as `td` (a tensordict.TensorDict): nesting,\n"
          "batch size, names and non-tensor entries kept. CPU leaves only.")
      .def(
          "to_tensordict", [](const PyTensorDict& self) { return to_tensordict_lib(self.td()); },
          "A tensordict.TensorDict whose torch leaves share memory with this TensorDict\n"
          "(non-tensor entries as NonTensorData / NonTensorStack).")
      .def(
          "get_torch",
          [](const PyTensorDict& self, nb::handle key) {
            return to_torch(self.td().get(to_key(key)));
          },
          nb::arg("key"),
          "The leaf at `key` as a torch tensor sharing memory with this TensorDict.")
      .def("__eq__", [](const PyTensorDict& self, nb::handle o) { return compare(self, o, true); })
      .def("__ne__", [](const PyTensorDict& self, nb::handle o) { return compare(self, o, false); })
      .def(
          "all", [](const PyTensorDict& self) { return all_true(self.td()); },
          "True when every element of every tensor leaf is true (for `(a == b).all()`).")
      .def("__bool__",
           [](const PyTensorDict&) -> bool {
             throw ValueError(
                 "the truth value of a TensorDict is ambiguous: use (a == b).all() or a.equal(b)");
           })
      .def("equal", [](const PyTensorDict& self,
                       const PyTensorDict& other) { return equal(self.td(), other.td()); })
      .def(
          "difference",
          [](const PyTensorDict& self, const PyTensorDict& other) -> nb::object {
            std::string why;
            if (equal(self.td(), other.td(), &why)) return nb::none();
            return nb::str(why.c_str());
          },
          "None when equal, else a description of the first difference.")
      .def("__repr__", [](const PyTensorDict& self) { return describe(self.td()); });

  m.def(
      "stack",
      [](nb::sequence tds) {
        std::vector<TensorDict> v;
        for (nb::handle h : tds) {
          if (!nb::isinstance<PyTensorDict>(h))
            throw TypeError("stack: expected a sequence of TensorDicts");
          v.push_back(nb::cast<PyTensorDict&>(h).td());
        }
        NoGil nogil;
        return PyTensorDict(TensorDict::stack(v));
      },
      nb::arg("tds"));
  m.def(
      "_from_consolidated",
      [](nb::handle storage, nb::handle metadata) {
        // A consolidated dict written by someone else (tensordict, a pickle): its storage
        // bytes and metadata, validated like any untrusted input, viewed without a copy.
        auto t = to_tensor(storage);
        if (!t || t->dtype() != DType::UInt8 || t->dim() != 1 || !t->is_contiguous())
          throw TypeError("_from_consolidated: storage must be a contiguous 1-d uint8 array");
        Storage bytes = Storage::external(
            t->data(), t->nbytes(), [keep = *t] {}, Storage::Kind::External);
        return PyTensorDict(wire::view_consolidated(bytes, to_json(metadata, "metadata")));
      },
      nb::arg("storage"), nb::arg("metadata"));
  m.def(
      "load",
      [](nb::handle path) {
        std::string p = path_arg(path);
        NoGil nogil;
        return PyTensorDict(load(p));
      },
      nb::arg("path").none(),
      "Reads a file written by TensorDict.save() or tensordict's consolidate(filename=...):\n"
      "a locked TensorDict whose leaves view a private copy-on-write mapping of the file.\n"
      "ProtocolError when the file is not one (every offset and size is checked).");

  // A bad TENSORWIRE_STORAGE_CACHE_MB: the C++ side keeps its default; say so once.
  if (std::string why = storage_cache_env_problem(); !why.empty())
    if (PyErr_WarnEx(PyExc_RuntimeWarning, why.c_str(), 1) != 0) throw nb::python_error();

  // The storage cache for large blocks (tensorwire/core/storage.h).
  m.def(
      "set_storage_cache_limit",
      [](int64_t nbytes) {
        if (nbytes < 0)
          throw ValueError(
              "set_storage_cache_limit: nbytes must be >= 0 (0 turns the cache off), got " +
              std::to_string(nbytes));
        set_storage_cache_limit(static_cast<size_t>(nbytes));
      },
      nb::arg("nbytes"),
      "Bytes of released large storages kept for reuse (0 turns the cache off).");
  m.def("release_storage_cache", &release_storage_cache,
        "Returns every cached storage block to the system.");
  m.def(
      "storage_cache_stats",
      []() {
        StorageCacheStats s = storage_cache_stats();
        nb::dict d;
        d["cached_bytes"] = s.cached_bytes;
        d["cached_blocks"] = s.cached_blocks;
        d["limit_bytes"] = s.limit_bytes;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        return d;
      },
      "The storage cache's counters: cached_bytes, cached_blocks, limit_bytes, hits, misses.");
}

}  // namespace tensorwire::py
