// The profile store's file format: header (magic, version, CRC-32, length)
// and JSON body, decoded and turned into a servable entry as
// ProfileStore::Open does for every file in its data directory. The first
// byte picks whether the input is a whole file (the header is fuzzed) or a
// body given a correct header (the body is fuzzed past the checksum).
#include "fuzz_util.h"
#include "moeplan/proto/json.h"
#include "moeplan/server/profile_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  if (size == 0) return 0;
  const std::string_view rest = fuzz::View(data + 1, size - 1);
  const std::string file = (data[0] & 1) ? server::EncodeProfileFile(rest) : std::string(rest);
  auto body = server::DecodeProfileFile(file);
  // What EncodeProfileFile wrote always decodes to the same body.
  if ((data[0] & 1) && (!body.ok() || *body != rest)) std::abort();
  if (!body.ok()) return 0;
  v1::ClusterProfile msg;
  if (!proto::ParseJson(*body, &msg).ok()) return 0;
  (void)server::MakeProfileEntry(std::move(msg), /*builtin=*/false);
  return 0;
}
