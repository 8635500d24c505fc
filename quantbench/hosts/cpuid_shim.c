/* quantbench CPUID shim: LD_PRELOADed into a masked x86 worker (quantbench/hosts/masked.py).
 *
 * The masked copy of numpy and onnxruntime has every `cpuid` (0F A2) replaced by `ud2` (0F 0B)
 * (quantbench/hosts/cpuidpatch.py). Executing one raises SIGILL; the handler below checks that the
 * faulting bytes are 0F 0B inside an executable file mapping under QUANTBENCH_CPUID_ROOT (the masked
 * copy), executes the real CPUID for the guest's EAX/ECX, applies the profile, writes EAX..EDX into
 * the ucontext and steps over the 2 bytes. Every other SIGILL goes to the handler installed after us
 * (sigaction/signal are interposed, so e.g. Python's faulthandler is recorded, not installed over us)
 * or to the default action, so a real crash still ends the process as before. SIGSEGV is untouched.
 *
 * QUANTBENCH_CPUID_PROFILE = "VENDOR12CHARS,SIG,M1C,M1D,M7B,M7C,M7D,M71A,MXCR0,M81C,M81D" (hex):
 * leaf 0 vendor, leaf 1 EAX signature, then AND-masks of leaf 1 ECX/EDX, 7.0 EBX/ECX/EDX, 7.1 EAX,
 * 0xD.0 EAX (XSAVE components; a cleared component's 0xD subleaf reads as zeros), 0x80000001 ECX/EDX.
 * QUANTBENCH_CPUID_BRAND = the 0x80000002-4 brand string (optional); QUANTBENCH_CPUID_SITES: see sites[] below.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static struct sigaction next_ill; /* the SIGILL handler to chain to (SIG_DFL until someone installs one) */
static int active;
/* paths as long as the kernel's: a QUANTBENCH_HOME deep in a runner's folders reaches past 200 characters */
#define QB_PATH 4096
static char vendor[12], brand[48], root[QB_PATH];
static uint32_t sig1, m[10];
static struct { uintptr_t lo, hi, mapoff; unsigned long traps; int path_id; char path[QB_PATH]; } ranges[64];
static int nranges;
/* QUANTBENCH_CPUID_SITES: "PATH<TAB>HEX-FILE-OFFSET" lines, every patched site; a ud2 elsewhere in the copy
 * (a compiler's trap that was there before patching) is a real SIGILL. */
static struct { int path_id; unsigned long off; } sites[8192];
static char site_paths[32][QB_PATH];
static int nsites, npaths;
extern char qb_trap_site[]; /* the ud2 in qb_cpuid: CPUID through the trap path, for the worker */

static void real_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

static void masked_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    real_cpuid(leaf, sub, r);
    if (leaf == 0) { memcpy(&r[1], vendor, 4); memcpy(&r[3], vendor + 4, 4); memcpy(&r[2], vendor + 8, 4); }
    else if (leaf == 1) { r[0] = sig1; r[2] &= m[0]; r[3] &= m[1]; }
    else if (leaf == 7 && sub == 0) { r[1] &= m[2]; r[2] &= m[3]; r[3] &= m[4]; }
    else if (leaf == 7 && sub == 1) { r[0] &= m[5]; }
    else if (leaf == 0xd && !((m[0] >> 26) & 1)) { r[0] = r[1] = r[2] = r[3] = 0; } /* no XSAVE: no 0xD leaf */
    else if (leaf == 0xd && sub == 0) { r[0] &= m[6]; }
    else if (leaf == 0xd && sub >= 2 && sub < 32 && !((m[6] >> sub) & 1)) { r[0] = r[1] = r[2] = r[3] = 0; }
    else if (leaf == 0x80000001) { r[2] &= m[7]; r[3] &= m[8]; }
    else if (leaf >= 0x80000002 && leaf <= 0x80000004 && brand[0]) memcpy(r, brand + 16 * (leaf - 0x80000002), 16);
}

/* Whether ip lies in an executable mapping of a file under root (looked up in /proc/self/maps with
 * async-signal-safe calls only, then cached). Returns the range index or -1. */
static int lookup_range(uintptr_t ip) {
    static char buf[1 << 18];
    for (int i = 0; i < nranges; i++) if (ip >= ranges[i].lo && ip < ranges[i].hi) return i;
    int fd = open("/proc/self/maps", O_RDONLY), n = 0, k;
    if (fd < 0) return -1;
    while (n < (int)sizeof buf - 1 && (k = read(fd, buf + n, sizeof buf - 1 - n)) > 0) n += k;
    close(fd);
    buf[n] = 0;
    for (char *line = buf, *end; *line; line = end + 1) {
        if (!(end = strchr(line, '\n'))) end = line + strlen(line) - 1;
        char *p = line, *path = strchr(line, '/');
        uintptr_t lo = strtoul(p, &p, 16), hi = strtoul(p + 1, &p, 16);
        if (ip < lo || ip >= hi) continue;
        if (p[3] != 'x' || !path || path > end || strncmp(path, root, strlen(root)) || nranges == 64) return -1;
        ranges[nranges].lo = lo; ranges[nranges].hi = hi; ranges[nranges].mapoff = strtoul(p + 6, NULL, 16);
        size_t len = (size_t)(end - path) < sizeof ranges[0].path - 1 ? (size_t)(end - path) : sizeof ranges[0].path - 1;
        memcpy(ranges[nranges].path, path, len);
        ranges[nranges].path_id = -1;
        for (int j = 0; j < npaths; j++) if (!strcmp(site_paths[j], ranges[nranges].path)) ranges[nranges].path_id = j;
        return nranges++;
    }
    return -1;
}

static int patched_range(uintptr_t ip) { /* one thread at a time: the cache and buf are shared */
    static volatile int lock;
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) ;
    int r = lookup_range(ip);
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
    return r;
}

static int patched_site(int range, uintptr_t ip) {
    if (!nsites) return 1; /* no list: every ud2 in the copy is a patched cpuid */
    unsigned long off = ip - ranges[range].lo + ranges[range].mapoff;
    for (int k = 0; k < nsites; k++) if (sites[k].path_id == ranges[range].path_id && sites[k].off == off) return 1;
    return 0;
}

static void on_sigill(int sig, siginfo_t *si, void *ucv) {
    greg_t *g = ((ucontext_t *)ucv)->uc_mcontext.gregs;
    unsigned char *ip = (unsigned char *)g[REG_RIP];
    int range = -2;
    if (ip[0] == 0x0f && ip[1] == 0x0b && (ip == (unsigned char *)qb_trap_site || ((range = patched_range((uintptr_t)ip)) >= 0 && patched_site(range, (uintptr_t)ip)))) {
        uint32_t r[4];
        masked_cpuid((uint32_t)g[REG_RAX], (uint32_t)g[REG_RCX], r);
        g[REG_RAX] = r[0]; g[REG_RBX] = r[1]; g[REG_RCX] = r[2]; g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        if (range >= 0) __atomic_fetch_add(&ranges[range].traps, 1, __ATOMIC_RELAXED);
        return;
    }
    if (next_ill.sa_flags & SA_SIGINFO) next_ill.sa_sigaction(sig, si, ucv);
    else if (next_ill.sa_handler != SIG_DFL && next_ill.sa_handler != SIG_IGN) next_ill.sa_handler(sig);
    else { struct sigaction dfl = {0}; dfl.sa_handler = SIG_DFL; real_sigaction(SIGILL, &dfl, NULL); } /* re-faults: default action */
}

int sigaction(int signum, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (signum != SIGILL || !active) return real_sigaction(signum, act, old);
    if (old) *old = next_ill;   /* callers see (and later restore) the handler they would have replaced */
    if (act) next_ill = *act;
    return 0;
}

sighandler_t signal(int signum, sighandler_t handler) {
    if (signum != SIGILL || !active) return ((sighandler_t (*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal"))(signum, handler);
    struct sigaction act = {0}, old;
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    return sigaction(signum, &act, &old) ? SIG_ERR : old.sa_handler;
}

/* For the worker (ctypes): the masked CPUID through the trap path, and the traps per library. */
__attribute__((noinline)) void qb_cpuid(uint32_t leaf, uint32_t sub, uint32_t out[4]) {
    uint32_t a = leaf, b, c = sub, d;
    if (!active) { real_cpuid(leaf, sub, out); return; }
    __asm__ volatile(".globl qb_trap_site\n.hidden qb_trap_site\nqb_trap_site: ud2"
                     : "+a"(a), "=b"(b), "+c"(c), "=d"(d) : : "memory");
    out[0] = a; out[1] = b; out[2] = c; out[3] = d;
}

unsigned long qb_trap_count(const char *substr) {
    unsigned long n = 0;
    for (int i = 0; i < nranges; i++) if (strstr(ranges[i].path, substr)) n += ranges[i].traps;
    return n;
}

int qb_active(void) { return active; }

__attribute__((constructor)) static void qb_init(void) {
    const char *prof = getenv("QUANTBENCH_CPUID_PROFILE"), *r = getenv("QUANTBENCH_CPUID_ROOT"), *b = getenv("QUANTBENCH_CPUID_BRAND");
    real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (!prof || !r || strlen(prof) < 13 || prof[12] != ',' || strlen(r) >= sizeof root) return;
    memcpy(vendor, prof, 12);
    if (sscanf(prof + 13, "%x,%x,%x,%x,%x,%x,%x,%x,%x,%x", &sig1, &m[0], &m[1], &m[2], &m[3], &m[4], &m[5],
               &m[6], &m[7], &m[8]) != 10) {
        fprintf(stderr, "quantbench cpuid shim: malformed QUANTBENCH_CPUID_PROFILE %s\n", prof);
        _exit(70);
    }
    strcpy(root, r);
    if (b) strncpy(brand, b, sizeof brand);
    FILE *f = getenv("QUANTBENCH_CPUID_SITES") ? fopen(getenv("QUANTBENCH_CPUID_SITES"), "r") : NULL;
    static char path[QB_PATH];
    unsigned long off;
    while (f && nsites < 8192 && fscanf(f, "%4095[^\t]\t%lx\n", path, &off) == 2) {
        int j = 0;
        while (j < npaths && strcmp(site_paths[j], path)) j++;
        if (j == npaths && npaths < 32) strcpy(site_paths[npaths++], path);
        if (j < 32) { sites[nsites].path_id = j; sites[nsites++].off = off; }
    }
    if (f) fclose(f);
    struct sigaction act = {0};
    act.sa_sigaction = on_sigill;
    act.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&act.sa_mask);
    next_ill.sa_handler = SIG_DFL;
    if (real_sigaction(SIGILL, &act, NULL) == 0) active = 1;
}
