/* SPDX-License-Identifier: MIT */
/*
 * A program that calls the CUDA runtime and knows nothing of dormant, except
 * where a mode checks what the shim did (through the C API). Run under
 * libdormant-preload.so on the host backend by test_preload.py:
 *   capture-test MODE [ARGS]   prints "PASS MODE" and exits 0, or "FAIL: ..."
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dormant.h"
#include "dormant-preload.h"
#include "fake_cudart.h"

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (dormant_last_error: %s)\n", dormant_last_error());
	fflush(stdout);
	exit(1);
}

#define CHECK(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)

/* The shim's own functions, from LD_PRELOAD: this program does not link it. */
static void *shim_symbol(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);

	if (!p) {
		printf("FAIL: %s not found: is libdormant-preload.so preloaded?\n", name);
		exit(1);
	}
	return p;
}

static int preload_manager(struct dormant **ret)
{
	int (*fn)(struct dormant **);

	*(void **)&fn = shim_symbol("dormant_preload_manager");
	return fn(ret);
}

static void preload_stats(struct dormant_preload_stats *ret)
{
	int (*fn)(struct dormant_preload_stats *);

	*(void **)&fn = shim_symbol("dormant_preload_stats_get");
	fn(ret);
}

static struct dormant *the_manager(void)
{
	struct dormant *m = NULL;
	int r = preload_manager(&m);

	CHECK(r == 0 && m, "dormant_preload_manager: %d", r);
	return m;
}

static const struct dormant_tag_stats *tag_stats(struct dormant_stats *st, const char *tag)
{
	for (size_t i = 0; i < st->tag_count; i++)
		if (strcmp(st->tags[i].tag, tag) == 0)
			return &st->tags[i];
	return NULL;
}

static struct dormant_stats *stats(void)
{
	static struct dormant_stats st;

	CHECK(dormant_stats_get(the_manager(), &st) == 0, "stats");
	return &st;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed);
}

static int check(const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 31 + seed))
			return 0;
	return 1;
}

/* Allocations are the manager's under "default", keep: data survives sleep
 * and wake at the same address; nothing reached the fake runtime. */
static void mode_basic(void)
{
	static const size_t sizes[] = { 1 << 20, 3 << 20, 100 };
	unsigned char *p[3];
	const struct dormant_tag_stats *t;
	struct dormant_report report;
	struct dormant_preload_stats ps;

	for (int i = 0; i < 3; i++) {
		CHECK(cudaMalloc((void **)&p[i], sizes[i]) == 0, "cudaMalloc %d", i);
		fill(p[i], sizes[i], (unsigned)i);
	}
	CHECK(fake_cuda_count(FAKE_MALLOC) == 0, "cudaMalloc reached the runtime");
	CHECK(dormant_torch_get_manager() == the_manager(),
	      "the process manager is not registered for dormant_torch_malloc");
	t = tag_stats(stats(), "default");
	CHECK(t && t->allocations == 3 && t->bytes == (1 << 20) + (3 << 20) + 100 &&
	      t->policy == DORMANT_KEEP, "default tag: %llu allocations",
	      t ? (unsigned long long)t->allocations : 0ULL);
	CHECK(dormant_sleep(the_manager(), NULL, &report) == 0, "sleep");
	t = tag_stats(stats(), "default");
	CHECK(t->state == DORMANT_ASLEEP && t->device_bytes == 0, "not asleep");
	CHECK(report.bytes_copied >= (1 << 20) + (3 << 20) + 100, "copied %llu",
	      (unsigned long long)report.bytes_copied);
	CHECK(dormant_wake(the_manager(), NULL, &report) == 0, "wake");
	for (int i = 0; i < 3; i++)
		CHECK(check(p[i], sizes[i], (unsigned)i), "buffer %d changed over sleep/wake", i);
	for (int i = 0; i < 3; i++)
		CHECK(cudaFree(p[i]) == 0, "cudaFree %d", i);
	CHECK(fake_cuda_count(FAKE_FREE) == 0, "cudaFree of ours reached the runtime");
	CHECK(fake_cuda_count(FAKE_DEVICE_SYNCHRONIZE) >= 3, "cudaFree did not wait for the device");
	CHECK(stats()->allocations == 0, "allocations left");
	preload_stats(&ps);
	CHECK(ps.active && ps.captured_allocations == 3 && ps.captured_frees == 3,
	      "preload stats %llu/%llu", (unsigned long long)ps.captured_allocations,
	      (unsigned long long)ps.captured_frees);
}

/* Pointers the manager did not hand out go to the runtime's cudaFree. */
static void mode_foreign(void)
{
	void *mine, *theirs, *junk = (void *)0x1000;
	struct dormant_preload_stats ps;

	CHECK(cudaMalloc(&mine, 4096) == 0, "cudaMalloc");
	CHECK(fake_cuda_foreign_malloc(&theirs, 4096) == 0, "foreign malloc");
	CHECK(cudaFree(theirs) == 0, "cudaFree of a foreign pointer failed");
	CHECK(fake_cuda_count(FAKE_FREE) == 1, "foreign free did not reach the runtime");
	CHECK(cudaFree(junk) == 1, "a bad pointer must get the runtime's error");
	CHECK(fake_cuda_count(FAKE_FREE) == 2, "bad free did not reach the runtime");
	CHECK(cudaFree(NULL) == 0 && fake_cuda_count(FAKE_FREE) == 3,
	      "cudaFree(NULL) (context set-up) must reach the runtime");
	CHECK(cudaFree((char *)mine + 512) == 1, "an interior pointer is not an allocation");
	CHECK(stats()->allocations == 1, "the allocation went away");
	CHECK(cudaFree(mine) == 0, "cudaFree");
	preload_stats(&ps);
	CHECK(ps.foreign_frees == 3 && ps.captured_frees == 1, "foreign %llu captured %llu",
	      (unsigned long long)ps.foreign_frees, (unsigned long long)ps.captured_frees);
}

/* The thread's tag chooses the tag; a discard tag comes back zero-filled. */
static void mode_tags(void)
{
	unsigned char *kept, *grads, *scratch;
	const struct dormant_tag_stats *t;

	CHECK(dormant_set_policy(the_manager(), "grads", DORMANT_DISCARD) == 0, "policy");
	CHECK(dormant_set_thread_tag("grads") == 0, "thread tag");
	CHECK(cudaMalloc((void **)&grads, 1 << 20) == 0, "cudaMalloc grads");
	CHECK(dormant_set_thread_tag(NULL) == 0, "thread tag reset");
	CHECK(cudaMalloc((void **)&kept, 1 << 20) == 0, "cudaMalloc kept");
	/* a no-backup allocation inside the kept "default" tag */
	CHECK(dormant_set_thread_policy(DORMANT_DISCARD) == 0, "thread policy");
	CHECK(cudaMalloc((void **)&scratch, 1 << 20) == 0, "cudaMalloc scratch");
	CHECK(dormant_set_thread_policy(DORMANT_POLICY_TAG) == 0, "thread policy reset");
	fill(kept, 1 << 20, 7);
	memset(grads, 0xab, 1 << 20);
	memset(scratch, 0xcd, 1 << 20);
	t = tag_stats(stats(), "grads");
	CHECK(t && t->allocations == 1, "grads tag");
	t = tag_stats(stats(), "default");
	CHECK(t && t->allocations == 2, "default tag");
	CHECK(dormant_sleep(the_manager(), NULL, NULL) == 0, "sleep");
	CHECK(dormant_wake(the_manager(), NULL, NULL) == 0, "wake");
	CHECK(check(kept, 1 << 20, 7), "kept data lost");
	for (size_t i = 0; i < 1 << 20; i++)
		CHECK(grads[i] == 0 && scratch[i] == 0, "discarded byte %zu is %d/%d", i, grads[i],
		      scratch[i]);
}

/* Error codes a CUDA program expects. */
static void mode_errors(void)
{
	void *p = (void *)1;

	CHECK(cudaMalloc(NULL, 16) == 1, "NULL devPtr: cudaErrorInvalidValue");
	CHECK(cudaMalloc(&p, 0) == 0 && p == NULL, "size 0: success and NULL");
	/* DORMANT_HOST_DEVICE_BYTES is small in this test */
	CHECK(cudaMalloc(&p, (size_t)1 << 40) == 2, "too much: cudaErrorMemoryAllocation");
	CHECK(cudaMalloc(&p, 4096) == 0, "cudaMalloc");
	CHECK(fake_cuda_count(FAKE_MALLOC) == 0, "cudaMalloc reached the runtime");
}

static int set_thread_region(int inside)
{
	int (*fn)(int);

	*(void **)&fn = shim_symbol("dormant_preload_set_thread_region");
	return fn(inside);
}

/*
 * Whole-process capture, a program allocating while its tag sleeps: outside
 * every region it gets ordinary memory from the runtime (usable, never in a
 * managed range, freed by the runtime); inside a region it is refused; after
 * the wake the tag captures again and its data is intact.
 */
static void mode_asleep(void)
{
	const size_t kept_size = (size_t)1 << 20;
	unsigned char buf[16];
	void *kept, *p, *q;

	CHECK(cudaMalloc(&kept, kept_size) == 0, "cudaMalloc");
	fill(kept, kept_size, 7);
	CHECK(dormant_sleep(the_manager(), NULL, NULL) == 0, "sleep");
	CHECK(cudaMalloc(&p, 4096) == 0, "outside every region while asleep: not refused");
	CHECK(fake_cuda_count(FAKE_MALLOC) == 1, "it is the runtime's ordinary memory");
	CHECK(dormant_copy_to_host(the_manager(), buf, p, 1) == -EINVAL,
	      "it lies in no managed range");
	memset(p, 0x5a, 4096); /* usable while the rest sleeps */
	CHECK(((unsigned char *)p)[4095] == 0x5a, "ordinary memory holds what was written");
	CHECK(set_thread_region(1) == 0, "dormant_preload_set_thread_region(1)");
	CHECK(cudaMalloc(&q, 4096) == 2, "inside a region of a sleeping tag: refused");
	CHECK(set_thread_region(0) == 1, "dormant_preload_set_thread_region(0)");
	CHECK(set_thread_region(2) == -EINVAL, "another value: -EINVAL");
	/* a tag the thread chose is a region too */
	CHECK(dormant_set_thread_tag("weights") == 0, "dormant_set_thread_tag");
	CHECK(cudaMalloc(&q, 4096) == 0 && dormant_owns(the_manager(), q), "awake tag: captured");
	CHECK(dormant_sleep(the_manager(), (const char *[]){ "weights", NULL }, NULL) == 0,
	      "sleep weights");
	CHECK(cudaMalloc(&q, 4096) == 2, "under a chosen tag that sleeps: refused");
	CHECK(dormant_set_thread_tag(NULL) == 0, "dormant_set_thread_tag(NULL)");
	CHECK(fake_cuda_count(FAKE_MALLOC) == 1, "the refused one reached the runtime");
	CHECK(cudaFree(p) == 0 && fake_cuda_count(FAKE_FREE) == 1, "freed by the runtime");
	CHECK(dormant_wake(the_manager(), NULL, NULL) == 0, "wake");
	CHECK(check(kept, kept_size, 7), "kept memory changed over sleep/wake");
	CHECK(cudaMalloc(&q, 4096) == 0 && dormant_owns(the_manager(), q), "captured after wake");
	CHECK(fake_cuda_count(FAKE_MALLOC) == 1, "after the wake cudaMalloc reached the runtime");
	CHECK(cudaFree(q) == 0 && cudaFree(kept) == 0, "cudaFree");
}

/* What is not captured goes to the runtime and is counted. */
static void mode_passthrough(void)
{
	void *a, *b, *h, *mine;
	struct dormant_preload_stats ps;

	CHECK(cudaMallocAsync(&a, 1000, NULL) == 0, "cudaMallocAsync");
	CHECK(cudaMallocManaged(&b, 2000, 1) == 0, "cudaMallocManaged");
	CHECK(cudaMallocHost(&h, 3000) == 0, "cudaMallocHost");
	CHECK(fake_cuda_count(FAKE_MALLOC_ASYNC) == 1 && fake_cuda_count(FAKE_MALLOC_MANAGED) == 1 &&
	      fake_cuda_count(FAKE_MALLOC_HOST) == 1, "not passed through");
	CHECK(cudaFreeAsync(a, NULL) == 0 && fake_cuda_count(FAKE_FREE_ASYNC) == 1,
	      "cudaFreeAsync of runtime memory");
	CHECK(cudaFree(b) == 0 && fake_cuda_count(FAKE_FREE) == 1, "cudaFree of managed memory");
	CHECK(cudaFreeHost(h) == 0 && fake_cuda_count(FAKE_FREE_HOST) == 1, "cudaFreeHost");
	/* a captured pointer given back stream-ordered: the stream is waited for */
	CHECK(cudaMalloc(&mine, 4096) == 0, "cudaMalloc");
	CHECK(cudaFreeAsync(mine, NULL) == 0, "cudaFreeAsync of ours");
	CHECK(fake_cuda_count(FAKE_FREE_ASYNC) == 1, "cudaFreeAsync of ours reached the runtime");
	CHECK(fake_cuda_count(FAKE_STREAM_SYNCHRONIZE) == 1, "the stream was not waited for");
	CHECK(stats()->allocations == 0, "left allocated");
	preload_stats(&ps);
	CHECK(ps.async_allocations == 1 && ps.async_bytes == 1000 && ps.managed_allocations == 1 &&
	      ps.managed_bytes == 2000 && ps.captured_frees == 1, "preload stats");
}

/* Without $DORMANT_PRELOAD=1, or when capture was refused. */
static void mode_off(void)
{
	void *p;
	struct dormant *m = NULL;
	struct dormant_preload_stats ps;

	CHECK(cudaMalloc(&p, 4096) == 0 && fake_cuda_count(FAKE_MALLOC) == 1, "not passed through");
	CHECK(cudaFree(p) == 0 && fake_cuda_count(FAKE_FREE) == 1, "free not passed through");
	CHECK(preload_manager(&m) == -ENOTSUP && !m, "a manager while off");
	preload_stats(&ps);
	CHECK(!ps.active && strstr(ps.reason, "off"), "reason %s", ps.reason);
}

static void mode_refused(const char *expect)
{
	void *p = NULL;
	struct dormant *m = NULL;
	struct dormant_preload_stats ps;

	CHECK(cudaMalloc(&p, 4096) == 3, "cudaMalloc must fail with cudaErrorInitializationError");
	CHECK(fake_cuda_count(FAKE_MALLOC) == 0, "a refused cudaMalloc reached the runtime");
	CHECK(preload_manager(&m) == -EPERM && !m, "a manager while refused");
	preload_stats(&ps);
	CHECK(!ps.active && strstr(ps.reason, expect), "reason '%s' lacks '%s'", ps.reason, expect);
	CHECK(ps.failed_allocations == 1, "failed allocations");
}

/* A fork() child of a captured process passes everything through; a child
 * of a process that had not started captures on its own. */
static void mode_fork(void)
{
	void *p, *q;
	pid_t pid;
	int status;

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		/* forked before the parent's first CUDA call */
		CHECK(cudaMalloc(&q, 4096) == 0 && fake_cuda_count(FAKE_MALLOC) == 0,
		      "early child: not captured");
		CHECK(stats()->allocations == 1, "early child's manager");
		exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "early child failed");
	CHECK(cudaMalloc(&p, 4096) == 0, "cudaMalloc");
	memset(p, 1, 4096);
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct dormant *m = NULL;
		struct dormant_preload_stats ps;

		CHECK(preload_manager(&m) == -ENOTSUP, "child got the parent's manager");
		preload_stats(&ps);
		CHECK(!ps.active && strstr(ps.reason, "forked"), "child reason %s", ps.reason);
		CHECK(cudaMalloc(&q, 4096) == 0 && fake_cuda_count(FAKE_MALLOC) == 1,
		      "child cudaMalloc must reach the runtime");
		CHECK(cudaFree(q) == 0 && fake_cuda_count(FAKE_FREE) == 1, "child cudaFree");
		exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "child failed");
	CHECK(stats()->allocations == 1, "the parent's allocation");
	CHECK(cudaFree(p) == 0 && stats()->allocations == 0, "parent cudaFree");
}

#define THREADS 8
#define ROUNDS 200
static pthread_barrier_t barrier;

static void *worker(void *arg)
{
	unsigned id = (unsigned)(size_t)arg;
	char tag[32];
	void *held[4] = { 0 };

	snprintf(tag, sizeof(tag), "t%u", id % 3);
	if (id % 2)
		dormant_set_thread_tag(tag);
	pthread_barrier_wait(&barrier); /* all race for the first cudaMalloc */
	for (unsigned i = 0; i < ROUNDS; i++) {
		unsigned slot = i % 4;
		size_t size = 512 + ((i * 7919 + id * 104729) % 65536);

		if (held[slot]) {
			if (*(unsigned *)held[slot] != id * 100000 + i - 4) {
				printf("FAIL: thread %u: buffer overwritten\n", id);
				exit(1);
			}
			if (cudaFree(held[slot]) != 0) {
				printf("FAIL: thread %u: cudaFree\n", id);
				exit(1);
			}
		}
		if (cudaMalloc(&held[slot], size) != 0) {
			printf("FAIL: thread %u: cudaMalloc\n", id);
			exit(1);
		}
		*(unsigned *)held[slot] = id * 100000 + i;
	}
	for (unsigned slot = 0; slot < 4; slot++)
		cudaFree(held[slot]);
	return NULL;
}

static void mode_threads(void)
{
	pthread_t t[THREADS];
	struct dormant_preload_stats ps;

	pthread_barrier_init(&barrier, NULL, THREADS);
	for (size_t i = 0; i < THREADS; i++)
		CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0, "thread");
	for (size_t i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	preload_stats(&ps);
	CHECK(ps.captured_allocations == THREADS * ROUNDS &&
	      ps.captured_frees == THREADS * ROUNDS, "%llu allocations, %llu frees",
	      (unsigned long long)ps.captured_allocations, (unsigned long long)ps.captured_frees);
	CHECK(fake_cuda_count(FAKE_MALLOC) == 0 && fake_cuda_count(FAKE_FREE) == 0, "runtime used");
	CHECK(stats()->allocations == 0, "left allocated");
}

/* For the HTTP test: a buffer with a pattern; stdin says when to check it. */
static void mode_serve(void)
{
	unsigned char *p;
	char line[64];
	size_t size = 8 << 20;

	if (cudaMalloc((void **)&p, size) != 0) {
		printf("FAIL: cudaMalloc\n");
		exit(1);
	}
	fill(p, size, 3);
	printf("ready %p\n", (void *)p);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		if (strncmp(line, "check", 5) == 0)
			printf("%s\n", check(p, size, 3) ? "intact" : "changed");
		else if (strncmp(line, "free", 4) == 0)
			printf("free %d\n", cudaFree(p));
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(mode, "basic") == 0)
		mode_basic();
	else if (strcmp(mode, "foreign") == 0)
		mode_foreign();
	else if (strcmp(mode, "tags") == 0)
		mode_tags();
	else if (strcmp(mode, "errors") == 0)
		mode_errors();
	else if (strcmp(mode, "asleep") == 0)
		mode_asleep();
	else if (strcmp(mode, "passthrough") == 0)
		mode_passthrough();
	else if (strcmp(mode, "off") == 0)
		mode_off();
	else if (strcmp(mode, "refused") == 0 && argc > 2)
		mode_refused(argv[2]);
	else if (strcmp(mode, "fork") == 0)
		mode_fork();
	else if (strcmp(mode, "threads") == 0)
		mode_threads();
	else if (strcmp(mode, "serve") == 0) {
		mode_serve();
		return 0;
	} else {
		fprintf(stderr, "usage: capture-test basic|foreign|tags|errors|asleep|passthrough|off|"
				"refused WHY|fork|threads|serve\n");
		return 2;
	}
	printf("PASS %s\n", mode);
	return 0;
}
