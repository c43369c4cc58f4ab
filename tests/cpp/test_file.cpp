// save() / load(): tensordict's consolidated file layout, memory-mapped on load, validated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tensorwire/wire/file.h"

namespace tensorwire {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

Tensor fill_f32(Shape shape, float value) {
  std::vector<float> v(static_cast<size_t>(checked_numel(shape)), value);
  return Tensor::from_vector(v, std::move(shape));
}

TensorDict example() {
  TensorDict td({3});
  td.set("a", fill_f32({3, 4}, 1.5f));
  td.set({"b", "c"}, Tensor::zeros({3}, DType::Bool));
  td.set("s", NonTensor{"hi"});
  td.set("st", NonTensorStack{{3}, 0, {1, "two", nullptr}});
  return td;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file made of `storage` bytes, `json` and its little-endian u64 length.
void write_file(const std::string& path, size_t storage_bytes, const std::string& json,
                std::optional<uint64_t> length = std::nullopt) {
  std::vector<char> bytes(storage_bytes, 0);
  bytes.insert(bytes.end(), json.begin(), json.end());
  uint64_t n = length.value_or(json.size());
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  write_bytes(path, bytes);
}

class File : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tensorwire_test_file_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // load() must fail with a ProtocolError whose message contains `needle`.
  void expect_load_error(const std::string& file, const std::string& needle) {
    try {
      load(file);
      ADD_FAILURE() << "expected ProtocolError containing '" << needle << "'";
    } catch (const ProtocolError& e) {
      EXPECT_THAT(e.what(), HasSubstr(needle));
    }
  }

  fs::path dir_;
};

TEST_F(File, SaveThenLoadRoundTrips) {
  TensorDict td = example();
  save(td, path("td.bin"));
  TensorDict back = load(path("td.bin"));
  std::string why;
  EXPECT_TRUE(equal(td, back, &why)) << why;
  EXPECT_EQ(back.batch_size(), (Shape{3}));
  EXPECT_EQ(back.get_non_tensor("s"), "hi");
  EXPECT_TRUE(back.entry("st").is_non_tensor_stack());
}

TEST_F(File, FileIsStorageThenJsonThenLittleEndianJsonLength) {
  TensorDict td = example();
  save(td, path("td.bin"));
  std::vector<char> bytes = read_bytes(path("td.bin"));
  TensorDict c = consolidate(td);
  const std::string json = c.consolidated()->metadata->dump();
  const size_t storage = c.consolidated()->storage.nbytes();
  ASSERT_EQ(bytes.size(), storage + json.size() + 8);
  EXPECT_EQ(std::memcmp(bytes.data(), c.consolidated()->storage.data(), storage), 0);
  EXPECT_EQ(std::string(bytes.data() + storage, json.size()), json);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[storage + json.size() + i])) << (8 * i);
  EXPECT_EQ(n, json.size());
}

TEST_F(File, LoadIsAMemoryMapOfTheFile) {
  save(example(), path("td.bin"));
  TensorDict back = load(path("td.bin"));
  EXPECT_TRUE(back.is_consolidated());
  EXPECT_TRUE(back.is_locked());
  EXPECT_EQ(back.consolidated()->storage.kind(), Storage::Kind::Mapped);
  EXPECT_EQ(back.get("a").storage().kind(), Storage::Kind::Mapped);
  EXPECT_TRUE(back.get("a").storage().same(back.get({"b", "c"}).storage()));
}

TEST_F(File, WritingThroughALoadedTensorNeverChangesTheFile) {
  save(example(), path("td.bin"));
  std::vector<char> before = read_bytes(path("td.bin"));
  {
    TensorDict back = load(path("td.bin"));
    back.get("a").at<float>({0, 0}) = 99.0f;
  }
  EXPECT_EQ(read_bytes(path("td.bin")), before);
}

TEST_F(File, LoadedTensorDictOutlivesItsOtherReferences) {
  save(example(), path("td.bin"));
  Tensor a;
  { a = load(path("td.bin")).get("a"); }
  EXPECT_EQ((a.at<float>({2, 3})), 1.5f);  // the mapping is still alive
}

TEST_F(File, SaveIsAtomicAndLeavesNoTemporaryFile) {
  save(example(), path("td.bin"));
  save(example(), path("td.bin"));  // overwriting works too
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"td.bin"});
}

TEST_F(File, SaveIntoAMissingDirectoryIsASystemErrorAndLeavesNothing) {
  try {
    save(example(), path("missing/td.bin"));
    FAIL() << "saved";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.code(), ENOENT);
    // The caller's path, not only the temporary file's.
    EXPECT_THAT(e.what(), HasSubstr("cannot save to '" + path("missing/td.bin") + "'"));
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(File, SaveOverADirectoryIsAnEisdirNamingItAndLeavesNothing) {
  fs::create_directory(path("d"));
  try {
    save(example(), path("d"));
    FAIL() << "saved";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.code(), EISDIR);
    EXPECT_THAT(e.what(), HasSubstr("'" + path("d") + "'"));
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  EXPECT_THROW(save(example(), ""), ValueError);
}

// A NUL ends the path the system sees: "d\0x" would name the directory's sibling "d".
TEST_F(File, APathHoldingANulIsRefusedByName) {
  save(example(), path("td.bin"));
  const std::string with_nul = path("td.bin") + std::string(1, '\0') + "other";
  for (const char* call : {"save", "load"}) {
    try {
      if (std::string(call) == "save")
        save(example(), with_nul);
      else
        load(with_nul);
      FAIL() << call << " took a path holding a NUL";
    } catch (const ValueError& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr(call), HasSubstr("NUL")));
    }
  }
  EXPECT_THROW(load(""), ValueError);
}

TEST_F(File, LoadOfADirectoryOrAFifoIsRefusedAndNeverBlocks) {
  try {
    load(dir_.string());
    FAIL() << "loaded a directory";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.code(), EISDIR);
  }
  // Opening a FIFO for reading would wait for a writer for ever.
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  try {
    load(path("fifo"));
    FAIL() << "loaded a fifo";
  } catch (const ValueError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(path("fifo")), HasSubstr("not a regular file")));
  }
}

TEST_F(File, SaveOfAnAlreadyConsolidatedTensorDictWritesItsStorage) {
  TensorDict c = consolidate(example());
  save(c, path("td.bin"));
  EXPECT_TRUE(equal(load(path("td.bin")), c));
}

TEST_F(File, EmptyTensorDictRoundTrips) {
  save(TensorDict({2}), path("td.bin"));
  TensorDict back = load(path("td.bin"));
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(back.batch_size(), (Shape{2}));
}

TEST_F(File, LoadOfAMissingFileIsASystemError) {
  EXPECT_THROW(load(path("nope.bin")), SystemError);
}

TEST_F(File, LoadRejectsATruncatedFile) {
  write_bytes(path("short.bin"), {'a', 'b', 'c'});
  expect_load_error(path("short.bin"), "truncated");
  write_bytes(path("empty.bin"), {});
  expect_load_error(path("empty.bin"), "truncated");

  save(example(), path("td.bin"));
  std::vector<char> bytes = read_bytes(path("td.bin"));
  bytes.resize(bytes.size() - 3);  // the length trailer is cut
  write_bytes(path("cut.bin"), bytes);
  EXPECT_THROW(load(path("cut.bin")), ProtocolError);
}

TEST_F(File, LoadRejectsATrailerLengthLargerThanTheFile) {
  write_file(path("bad.bin"), 0, "{}", 1000);
  try {
    load(path("bad.bin"));
    FAIL() << "expected ProtocolError";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("metadata length 1000"), HasSubstr("bad.bin")));
  }
}

TEST_F(File, LoadRejectsMetadataOverTheLimit) {
  save(example(), path("td.bin"));
  wire::Limits limits;
  limits.max_metadata_bytes = 16;
  try {
    load(path("td.bin"), limits);
    FAIL() << "expected ProtocolError";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("exceeds the limit"));
  }
}

TEST_F(File, LoadRejectsCorruptJson) {
  write_file(path("bad.bin"), 8, "{\"cls\": \"TensorDict\", ");
  expect_load_error(path("bad.bin"), "malformed JSON");
}

TEST_F(File, LoadRejectsJsonThatIsNotTensordictMetadata) {
  write_file(path("bad.bin"), 0, "[1, 2, 3]");
  expect_load_error(path("bad.bin"), "must be a JSON object");
}

TEST_F(File, LoadRejectsALeafPastTheEndOfTheStorage) {
  TensorDict c = consolidate(example());
  const std::string json = c.consolidated()->metadata->dump();
  // Only 40 of the 56 storage bytes: leaf b.c (48..56) ends past them.
  write_file(path("short.bin"), 40, json);
  try {
    load(path("short.bin"));
    FAIL() << "expected ProtocolError";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'a'"), HasSubstr("past the storage")));
  }
  write_file(path("short2.bin"), 50, json);
  expect_load_error(path("short2.bin"), "'b.c'");
}

}  // namespace
}  // namespace tensorwire
