// fathom: one executable, subcommands. (placeholder until the CLI lands)
#include <cstdio>
int main() {
  std::puts("fathom: no subcommand yet");
  return 1;
}
