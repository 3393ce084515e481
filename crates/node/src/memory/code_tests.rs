use super::*;

const SMAPS: &str = "\
55d0c0000000-55d0c0a00000 r--p 00000000 fd:01 1234                       /usr/local/bin/my ferry
Size:              10240 kB
Rss:                2048 kB
Anonymous:             0 kB
55d0c0a00000-55d0c1e00000 r-xp 00a00000 fd:01 1234                       /usr/local/bin/my ferry
Size:              20480 kB
Rss:               15000 kB
Anonymous:             0 kB
55d0c1e00000-55d0c2000000 r--p 01e00000 fd:01 1234                       /usr/local/bin/my ferry
Size:               2048 kB
Rss:                2048 kB
Anonymous:          2040 kB
55d0c2000000-55d0c2010000 rw-p 02000000 fd:01 1234                       /usr/local/bin/my ferry
Size:                 64 kB
Rss:                  64 kB
Anonymous:             0 kB
55d0c2010000-55d0c2020000 r--p 02010000 fd:01 1234                       /usr/local/bin/my ferry
Size:                 64 kB
Rss:                   0 kB
Anonymous:             0 kB
7f0000000000-7f0000100000 r-xp 00000000 fd:01 99                         /usr/lib/libc.so.6
Size:               1024 kB
Rss:                 512 kB
Anonymous:             0 kB
7f0000080000-7f0000100000 r--p 00000000 fd:01 98                         /var/lib/data.so-not
Size:                512 kB
Rss:                 512 kB
Anonymous:             0 kB
7f0000100000-7f0000200000 rw-p 00000000 00:00 0 
Size:               1024 kB
Rss:                1024 kB
Anonymous:          1024 kB
7f0000200000-7f0000300000 r--p 00000000 fd:01 1234                       /usr/local/bin/my ferry
Size:               1024 kB
Rss:                 100 kB
";

#[test]
fn only_the_read_only_pages_of_the_executable_and_its_libraries_that_are_the_files_are_released() {
    assert_eq!(
        releasable(SMAPS, "/usr/local/bin/my ferry"),
        vec![
            0x55d0_c000_0000..0x55d0_c0a0_0000,
            0x55d0_c0a0_0000..0x55d0_c1e0_0000,
            0x7f00_0000_0000..0x7f00_0010_0000,
        ],
        "the read-only data and the code, and a shared library's code; not the relocated \
         (anonymous) RELRO pages, the writable data, a mapping with nothing resident, another \
         file, an anonymous mapping, nor a mapping whose anonymous pages were not read"
    );
    assert_eq!(
        releasable(SMAPS, "/usr/local/bin/other"),
        vec![0x7f00_0000_0000..0x7f00_0010_0000],
        "only the library"
    );
    assert!(is_shared_library("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    assert!(is_shared_library("/lib64/ld-linux-x86-64.so.2"));
    assert!(is_shared_library("/usr/lib/libfoo.so"));
    assert!(!is_shared_library("/var/lib/data.so-not"));
    assert!(!is_shared_library("libc.so.6"), "not a path");
    assert!(!is_shared_library("[vdso]"));
    assert!(releasable("", "/usr/local/bin/my ferry").is_empty());
    assert!(releasable("garbage\nRss: 5 kB\n", "garbage").is_empty());
}

/// A page of this test binary's read-only data, 1 MiB of it so that nothing else is near.
static FAR: [u8; 1 << 20] = [7; 1 << 20];

/// Whether the page at `addr` is mapped in this process (`/proc/self/pagemap`, bit 63).
fn present(addr: usize) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let page = 4096;
    let mut f = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
    f.seek(SeekFrom::Start((addr / page * 8) as u64))
        .expect("seek");
    let mut entry = [0u8; 8];
    f.read_exact(&mut entry).expect("an entry");
    u64::from_le_bytes(entry) >> 63 == 1
}

/// Reads `FAR[at]` until its page is mapped after the read (other tests of this binary release
/// code pages at any time, maybe between the read and the check); the byte read.
fn read_mapped(at: usize) -> u8 {
    let addr = FAR.as_ptr() as usize + at;
    let mut value = 0;
    for _ in 0..100 {
        // SAFETY: a read of a static.
        #[allow(unsafe_code)]
        let v = unsafe { std::ptr::read_volatile(FAR.as_ptr().add(at)) };
        value = v;
        if present(addr) {
            return value;
        }
    }
    panic!("FAR[{at}] read 100 times and never found mapped (read {value})");
}

#[test]
fn a_released_page_leaves_the_resident_set_and_reads_the_same_after() {
    let middle = FAR.len() / 2;
    let addr = FAR.as_ptr() as usize + middle;
    let before = read_mapped(middle);
    assert!(
        release() > 0,
        "the test binary has read-only pages resident"
    );
    // Only this test reads FAR, so nothing maps it back in between.
    assert!(!present(addr), "released");
    let after = read_mapped(middle);
    assert_eq!((before, after), (7, 7), "the file's content, read again");
}
