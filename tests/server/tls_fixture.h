// A test fixture with a temporary directory holding a CA, a server certificate
// for localhost and 127.0.0.1, its key and a bearer token, made by
// tests/server/make_test_certs.sh; the server a test starts is stopped, and the
// directory removed, after it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "moeplan/base/strings.h"
#include "moeplan/server/server.h"

namespace moeplan::server {

class TlsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeplan_tls_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string cmd =
        Cat("bash " MOEPLAN_SOURCE_DIR "/tests/server/make_test_certs.sh ", dir_, "/certs");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl is needed (scripts/setup.sh installs it)";
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  // ca.pem, server.pem, server.key or token.
  std::string Cert(const char* f) const { return Cat(dir_, "/certs/", f); }

  std::string dir_;
  std::unique_ptr<PlannerServer> server_;
};

}  // namespace moeplan::server
