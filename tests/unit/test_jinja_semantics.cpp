// The Jinja interpreter against jinja2: every case of tests/fixtures/chat_templates/semantics.txt
// renders to the text jinja2 3.1 (configured as Hugging Face configures it) rendered, or raises
// where jinja2 raised. The expectations in semantics.json are jinja2's own output, written by
// scripts/chat_template_fixtures.py.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/jinja/template.h"

namespace {

nlohmann::ordered_json load_cases() {
  std::ifstream f(std::string(FATHOM_SOURCE_DIR) + "/tests/fixtures/chat_templates/semantics.json");
  return nlohmann::ordered_json::parse(f);
}

TEST(JinjaSemantics, MatchesJinja2) {
  const auto doc = load_cases();
  ASSERT_GT(doc["cases"].size(), 100u);
  int checked = 0;
  for (const auto& c : doc["cases"]) {
    const std::string source = c["source"];
    SCOPED_TRACE(source);
    std::string text, error;
    try {
      text = fathom::jinja::Template::parse(source).render(doc["context"]).text;
    } catch (const fathom::jinja::Error& e) {
      error = e.what();
    }
    if (c.contains("text")) {
      EXPECT_EQ(error, "");
      EXPECT_EQ(text, c["text"].get<std::string>());
    } else {
      EXPECT_NE(error, "") << "jinja2 raised " << c["error"].get<std::string>() << ", we rendered: " << text;
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(doc["cases"].size()));
}

}  // namespace
