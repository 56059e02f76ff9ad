// The server's request handlers (moeplan/server/handlers.h) called in-process,
// as moeplan-server calls them for every RPC, with arbitrary requests. Byte 0
// picks the method (byte % 6: PlanLayer, PlanModel, ListProfiles, GetProfile,
// PutProfile, ReportMeasurement; a report against a100-8x8 goes to a stored
// copy three times and is refitted, RefitProfile) and the encoding (>= 0x80: binary protobuf,
// which reaches what JSON cannot say; else JSON); the rest is the request.
// Reads share one store and plan cache; a write gets a fresh store in a fresh
// directory, so each input replays alone. A handler must answer every input
// with a status; the limits of one request's work (docs/service.md) bound its
// time and memory, and a successful plan must fit the response limit. A binary
// plan request also goes through the bytes path the server runs (raw request
// bytes in, cached bytes out), which must answer as the typed path did.
#include <google/protobuf/util/message_differencer.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_util.h"
#include "moeplan/calibration/profiles.h"
#include "moeplan/proto/json.h"
#include "moeplan/server/handlers.h"

namespace {

using namespace moeplan;
namespace fs = std::filesystem;

server::HandlerOptions Options() {
  server::HandlerOptions o;
  o.log_requests = false;
  o.max_plan_time = std::chrono::seconds(5);  // libFuzzer's -timeout is 10 s
  return o;
}

fs::path TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "moeplan-fuzz-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

struct Shared {
  fs::path dir = TempDir();
  std::unique_ptr<server::ProfileStore> store;
  server::PlanCache cache{64, size_t{16} << 20};
  std::unique_ptr<server::Handlers> handlers;
  Shared() {
    server::ProfileStore::OpenReport report;
    auto s = server::ProfileStore::Open(dir.string(), &report);
    if (!s.ok()) std::abort();
    store = *std::move(s);
    handlers = std::make_unique<server::Handlers>(store.get(), &cache, Options());
  }
};

template <class Message>
bool Decode(bool binary, std::string_view bytes, Message* m) {
  if (binary) return m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  return proto::ParseJson(bytes, m).ok();
}

void Check(const absl::Status& s, const google::protobuf::Message& resp, size_t limit) {
  if (s.ok() && resp.ByteSizeLong() > limit) std::abort();
}

// The server's bytes path (raw request bytes in, cached bytes out) answers as
// the typed one did: the same status code and, on success, the same response.
template <class Response>
void CheckBytesPath(const absl::Status& typed, const Response& resp, const absl::Status& bytes,
                    const server::PlanCache::Value& out) {
  if (typed.code() != bytes.code()) std::abort();
  if (!typed.ok()) return;
  Response parsed;
  if (out == nullptr || !parsed.ParseFromString(*out)) std::abort();
  if (!google::protobuf::util::MessageDifferencer::Equals(parsed, resp)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static Shared* shared = new Shared();
  const bool binary = data[0] >= 0x80;
  const int method = data[0] % 6;
  const std::string_view bytes = fuzz::View(data + 1, size - 1);
  const server::NoDeadline call;
  server::Handlers& h = *shared->handlers;
  const size_t limit = h.options().max_response_bytes;
  switch (method) {
    case 0: {
      v1::PlanLayerRequest req;
      if (!Decode(binary, bytes, &req)) return 0;
      v1::PlanLayerResponse resp;
      const absl::Status s = h.PlanLayer(call, req, &resp);
      Check(s, resp, limit);
      if (binary) {
        server::PlanCache::Value out;
        CheckBytesPath(s, resp, h.PlanLayerBytes(call, bytes, &out), out);
      }
      break;
    }
    case 1: {
      v1::PlanModelRequest req;
      if (!Decode(binary, bytes, &req)) return 0;
      v1::PlanModelResponse resp;
      const absl::Status s = h.PlanModel(call, req, &resp);
      Check(s, resp, limit);
      if (binary) {
        server::PlanCache::Value out;
        CheckBytesPath(s, resp, h.PlanModelBytes(call, bytes, true, &out), out);
      }
      break;
    }
    case 2: {
      v1::ListProfilesRequest req;
      if (!Decode(binary, bytes, &req)) return 0;
      v1::ListProfilesResponse resp;
      Check(h.ListProfiles(call, req, &resp), resp, limit);
      break;
    }
    case 3: {
      v1::GetProfileRequest req;
      if (!Decode(binary, bytes, &req)) return 0;
      v1::ClusterProfile resp;
      Check(h.GetProfile(call, req, &resp), resp, limit);
      break;
    }
    default: {
      // Writes: a store of their own, removed afterwards.
      const fs::path dir = TempDir();
      {
        server::ProfileStore::OpenReport report;
        auto store = server::ProfileStore::Open(dir.string(), &report);
        if (!store.ok()) std::abort();
        server::PlanCache cache(16);
        server::Handlers w(store->get(), &cache, Options());
        if (method == 4) {
          v1::PutProfileRequest req;
          if (Decode(binary, bytes, &req)) {
            v1::PutProfileResponse resp;
            const absl::Status s = w.PutProfile(call, req, &resp);
            // An acknowledged profile is stored: a reopened store serves it.
            if (s.ok()) {
              server::ProfileStore::OpenReport again;
              auto reopened = server::ProfileStore::Open(dir.string(), &again);
              if (!reopened.ok() || !again.skipped.empty() ||
                  (*reopened)->Get(resp.name()) == nullptr ||
                  (*reopened)->Get(resp.name())->message.version() != resp.version()) {
                std::abort();
              }
            }
          }
        } else {
          v1::ReportMeasurementRequest req;
          if (Decode(binary, bytes, &req)) {
            // Against a stored copy of the built-in it names, three times
            // (the fewest instances a correction fits on), then refitted:
            // the refit reads back what the server stored and fits on it.
            const bool copy = req.profile_name() == "a100-8x8";
            if (copy) {
              v1::PutProfileRequest put;
              *put.mutable_profile() = *calibration::BuiltinProfile("a100-8x8");
              put.mutable_profile()->set_name("fuzz-copy");
              v1::PutProfileResponse put_resp;
              if (!w.PutProfile(call, put, &put_resp).ok()) std::abort();
              req.set_profile_name("fuzz-copy");
            }
            v1::ReportMeasurementResponse resp;
            bool stored = true;
            for (int i = 0; i < (copy ? 3 : 1) && stored; ++i) {
              stored = w.ReportMeasurement(call, req, &resp).ok();
            }
            if (copy && stored) {
              v1::RefitProfileRequest refit;
              refit.set_profile_name("fuzz-copy");
              v1::RefitProfileResponse refit_resp;
              const absl::Status s = w.RefitProfile(call, refit, &refit_resp);
              // An acknowledged refit is the version the store now serves.
              if (s.ok() && (*store)->Get("fuzz-copy")->message.version() !=
                                refit_resp.profile().version()) {
                std::abort();
              }
            }
          }
        }
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
      break;
    }
  }
  return 0;
}
