#include <cstdio>
int main() { std::puts("atelier: CLI under construction"); return 0; }
