// The HTML report's page (html_report.h): what input strings can and cannot do
// to it. In a browser:
// tests/report/report_browser_test.sh.
#include "moeplan/client/html_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "moeplan/proto/json.h"

namespace moeplan::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(HtmlReport, InputStringsCannotCloseTheScriptOrTheTitle) {
  EXPECT_EQ(EscapeScriptJson(R"({"name":"</script><b>&\u2028"})"),
            R"({"name":"\u003c/script\u003e\u003cb\u003e\u0026\u2028"})");
  EXPECT_EQ(EscapeScriptJson("\"\xe2\x80\xa8\xe2\x80\xa9\""), "\"\\u2028\\u2029\"");
  EXPECT_EQ(EscapeHtml("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");

  HtmlReport r;
  r.kind = "plan-model";
  r.title = "</title><script>alert(1)</script>";
  r.data_json = R"({"model":{"name":"</script><script>alert(2)</script>"}})";
  const std::string page = RenderHtml(r);
  // The data's, Chart.js's and report.js's: no input adds a fourth.
  EXPECT_EQ(Count(page, "</script>"), 3u);
  EXPECT_EQ(Count(page, "<title>"), 1u);
  EXPECT_THAT(page,
              HasSubstr("<title>&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>"));
  EXPECT_THAT(page, HasSubstr(R"("name":"\u003c/script\u003e\u003cscript\u003ealert(2))"));
  EXPECT_THAT(page, Not(HasSubstr("alert(2)</script>")));
  // Self-contained: the page names no other file or host.
  EXPECT_THAT(page, Not(HasSubstr("<script src")));
  EXPECT_THAT(page, Not(HasSubstr("<link")));
  EXPECT_THAT(page, HasSubstr("Chart.js v"));
}

}  // namespace
}  // namespace moeplan::client
