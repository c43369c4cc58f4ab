// Datapoints: a language-neutral tree (containers of tensors, scalars, strings, bytes,
// None and opaque blobs) carried as a TensorDict whose nodes record the structure, so
// that it travels wherever a TensorDict does (runners' shared memory, the remote wire).
// docs/protocol.md, "Datapoints", gives the format byte by byte.
//
// DatapointEncoder builds one container node; DatapointDecoder reads the structure of a
// consolidated layout once per schema (every tag, count, key, kind, dtype and size
// checked, before anything is allocated) and then the values of each datapoint from its
// storage (strings checked to be UTF-8). Both throw: the encoder ValueError for a value
// the format cannot hold, the decoder ProtocolError naming the element path and the rule.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire::wire {

// The entry of each container node that holds its structure tag.
inline constexpr std::string_view kDatapointTag = "_tensorwire_py";
// Containers nested deeper than this are not encoded as nodes (the encoder refuses them;
// a Python producer pickles them instead).
inline constexpr int kMaxDatapointDepth = 32;

enum class Container : char { List = 'l', Tuple = 't', Dict = 'd', Object = 'o' };

enum class ElementKind : char {
  Array = 'n',   // n-d array (numpy)
  Torch = 'T',   // n-d array to come back as a torch tensor
  Bool = 'b',    // 0-d bool
  Int = 'i',     // 0-d int64
  Float = 'f',   // 0-d float64
  Scalar = 'g',  // 0-d of any dtype (a numpy scalar)
  Str = 's',     // 1-d uint8, UTF-8
  Bytes = 'y',   // 1-d uint8
  None = 'N',    // a null non-tensor value
  Node = 'c',    // a nested container
  Pickle = 'p',  // 1-d uint8, an opaque blob (Python: pickled)
};

// ---- encoding ------------------------------------------------------------------------------

class DatapointEncoder {
 public:
  explicit DatapointEncoder(Container container);

  // Whether `key` may name a dict element (non-empty, no NUL, not the tag; a nested
  // container may not take a name of the consolidated metadata's own fields either).
  // A producer checks every key of a dict first and encodes a dict it refuses otherwise.
  static bool valid_key(std::string_view key, bool container) noexcept;

  // Each adds one element. `key` names it in a Dict and must be empty otherwise (list,
  // tuple and object elements are numbered). ValueError for a bad key, a second element
  // of an Object, an array kind given a 0-d shape rule it breaks.
  void add_array(std::string key, Tensor t, bool torch);
  void add_scalar(std::string key, Tensor t);  // 0-d
  void add_bool(std::string key, bool v);
  void add_int(std::string key, int64_t v);
  void add_float(std::string key, double v);
  void add_str(std::string key, std::string_view utf8);
  void add_bytes(std::string key, std::span<const std::byte> b);
  void add_pickle(std::string key, std::span<const std::byte> b);
  void add_none(std::string key);
  void add_node(std::string key, TensorDict node);  // a finished child node

  size_t size() const noexcept { return kinds_.empty() ? 0 : kinds_.size() - 1; }
  TensorDict finish() &&;

 private:
  std::string name(std::string key, bool container);
  void add(std::string key, ElementKind kind, Tensor t);
  void check_not_finished() const;  // Error once finish() took the kinds

  TensorDict td_;
  std::string kinds_;  // the container, then one kind per element
  Json keys_;          // a Dict's keys, in order
};

// ---- decoding ------------------------------------------------------------------------------

struct DatapointNode;

// One element of a container, as a schema fixes it (values are read per datapoint).
struct DatapointElement {
  ElementKind kind = ElementKind::None;
  std::string key;  // the dict key, or "0", "1", ... of a list, tuple or object
  // Leaves (all kinds but None and Node): where the bytes are in the storage.
  DType dtype = DType::UInt8;
  std::vector<size_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  std::unique_ptr<DatapointNode> child;  // Node
};

struct DatapointNode {
  Container container = Container::List;
  std::vector<DatapointElement> elements;
};

class DatapointDecoder {
 public:
  // The structure of every datapoint with this layout, or nullptr when the root node
  // carries no tag (a TensorDict that was not made from a datapoint). ProtocolError for a
  // tag that breaks any rule, and for a Pickle element unless `allow_pickle`.
  static std::unique_ptr<const DatapointNode> structure(const ConsolidatedLayout& layout,
                                                        bool allow_pickle);

  // ProtocolError when a value of this datapoint breaks a rule its structure cannot
  // (a Str whose bytes are not UTF-8), so that a receiver rejects the whole message before
  // converting any of it. `storage` holds at least the layout's total_bytes().
  static void check_values(const DatapointNode& root, const Storage& storage);

  // Values of one datapoint; `storage` holds at least the layout's total_bytes().
  static bool read_bool(const Storage& storage, const DatapointElement& e) noexcept;
  static int64_t read_int(const Storage& storage, const DatapointElement& e) noexcept;
  static double read_float(const Storage& storage, const DatapointElement& e) noexcept;
  // Str: ProtocolError when the bytes are not UTF-8.
  static std::string_view read_str(const Storage& storage, const DatapointElement& e);
  // Bytes and Pickle (and the raw bytes of any leaf).
  static std::span<const std::byte> read_bytes(const Storage& storage,
                                               const DatapointElement& e) noexcept;
};

}  // namespace tensorwire::wire
